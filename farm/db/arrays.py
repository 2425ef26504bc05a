"""Token arrays <-> the compact little-endian bytes stored in the trajectories table."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from farm.schemas import ArrayEncoding, B64Array

INT32 = np.dtype("<i4")
FLOAT32 = np.dtype("<f4")
UINT8 = np.dtype("u1")


def pack_ids(values: Sequence[int] | np.ndarray) -> bytes:
    return np.asarray(values, dtype=INT32).tobytes()


def pack_logprobs(values: Sequence[float] | np.ndarray) -> bytes:
    return np.asarray(values, dtype=FLOAT32).tobytes()


def pack_mask(values: Sequence[int] | np.ndarray) -> bytes:
    return np.asarray(values, dtype=UINT8).tobytes()


def unpack_ids(raw: bytes) -> list[int]:
    return np.frombuffer(raw, dtype=INT32).tolist()  # type: ignore[no-any-return]


def encode_ids(raw: bytes, encoding: ArrayEncoding) -> list[int] | B64Array:
    return B64Array.encode(raw, "int32") if encoding == "b64" else unpack_ids(raw)


def encode_logprobs(raw: bytes, encoding: ArrayEncoding) -> list[float] | B64Array:
    if encoding == "b64":
        return B64Array.encode(raw, "float32")
    return np.frombuffer(raw, dtype=FLOAT32).tolist()  # type: ignore[no-any-return]


def encode_mask(raw: bytes, encoding: ArrayEncoding) -> list[int] | B64Array:
    if encoding == "b64":
        return B64Array.encode(raw, "uint8")
    return np.frombuffer(raw, dtype=UINT8).tolist()  # type: ignore[no-any-return]
