"""Token arrays on the wire: JSON lists, base64 (``B64Array``) or a binary page's raw bytes (``RawArray``),
and the binary results page's constants."""

from __future__ import annotations

import base64
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, model_serializer

ArrayEncoding = Literal["b64", "json"]
ArrayDtype = Literal["int32", "float32", "uint8"]
_ITEMSIZE: dict[str, int] = {"int32": 4, "float32": 4, "uint8": 1}

#: the binary results page (``Accept: application/vnd.farm.results``), laid out as docs/api.md's
#: "Binary results pages" says: MAGIC, a uint32 LE header length, the JSON header, the array bytes.
RESULTS_MEDIA_TYPE = "application/vnd.farm.results"
RESULTS_MAGIC = b"FRP1"
#: every array in a binary page starts at a multiple of this many bytes from the page's start.
RESULTS_ALIGN = 8


#: ``(version, start, end)``: tokens ``[start, end)`` were sampled by the weights of ``version``.
#: A trajectory's spans cover exactly its model tokens (loss mask 1), in order; a model turn that a
#: weight update reached mid-decode (pause mode ``keep``) has one span per version.
VersionSpan = tuple[int, int, int]


class B64Array(BaseModel):
    """A little-endian array as base64: ~10x smaller and 50x faster to load than a JSON list."""

    dtype: ArrayDtype
    b64: str

    @classmethod
    def encode(cls, raw: bytes | memoryview, dtype: ArrayDtype) -> B64Array:
        return cls(dtype=dtype, b64=base64.b64encode(raw).decode("ascii"))


class RawArray(BaseModel):
    """A little-endian array's bytes as a binary results page carries them. Only ``farm.client``
    makes these (``encoding`` "binary"); no JSON answer holds one. Dumped, it is a ``B64Array``."""

    model_config = ConfigDict(arbitrary_types_allowed=True)

    dtype: ArrayDtype
    data: memoryview

    @model_serializer
    def _as_b64(self) -> dict[str, str]:
        return {"dtype": self.dtype, "b64": base64.b64encode(self.data).decode("ascii")}

    def __len__(self) -> int:
        return len(self.data) // _ITEMSIZE[self.dtype]

    def __array__(self, dtype: Any = None, copy: bool | None = None) -> Any:
        """``np.asarray(raw)``: a read-only view of the page's bytes (a copy with another dtype)."""
        import numpy as np

        array = np.frombuffer(self.data, dtype=np.dtype(self.dtype).newbyteorder("<"))
        if dtype is None and not copy:
            return array
        return array.astype(dtype or array.dtype, copy=True)
