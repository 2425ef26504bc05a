"""The binary results page, read side (``farm.api.binary`` writes it; layout: docs/api.md, "Binary results
pages"): a JSON header, then the trajectories' arrays as raw little-endian bytes. The arrays stay
views of the page's buffer, so a page of megabytes is copied once, off the socket.
"""

from __future__ import annotations

import struct
from typing import Any

import httpx
import numpy as np
import numpy.typing as npt
import pydantic_core

from farm.errors import ApiError
from farm.schemas import RESULTS_MAGIC, RESULTS_MEDIA_TYPE, RawArray, ResultsPage

#: what a binary-page request accepts: the binary page, else JSON.
BINARY_ACCEPT = f"{RESULTS_MEDIA_TYPE}, application/json;q=0.5"
_ITEMSIZE = {"int32": 4, "float32": 4, "uint8": 1}
_ARRAY_FIELDS = ("token_ids", "logprobs", "loss_mask")


def decode_page(body: bytes | memoryview) -> ResultsPage:
    """A binary results page; its arrays are views of ``body``.

    Raises:
        ApiError: the body is not a binary results page.
    """
    if body[: len(RESULTS_MAGIC)] != RESULTS_MAGIC or len(body) < len(RESULTS_MAGIC) + 4:
        raise ApiError(200, "bad_page", f"not a binary results page (starts {bytes(body[:8])!r})")
    start = len(RESULTS_MAGIC) + 4
    (length,) = struct.unpack_from("<I", body, len(RESULTS_MAGIC))
    header = pydantic_core.from_json(bytes(body[start : start + length]))  # ~2x json.loads
    data = memoryview(body)[start + length :]
    arrays: list[list[RawArray]] = []
    segment_arrays: dict[int, list[list[RawArray]]] = {}
    for item in header["items"]:
        traj = item.get("trajectory")
        if traj is None:
            continue
        views = []
        for name in _ARRAY_FIELDS:  # _views, inline: this loop runs for every trajectory of every page
            ref = traj[name]
            end = ref["offset"] + ref["length"] * _ITEMSIZE[ref["dtype"]]
            if end > len(data):
                raise ApiError(200, "bad_page", f"job {traj['job_id']}'s {name} runs past the page's end")
            views.append(RawArray(dtype=ref["dtype"], data=data[ref["offset"] : end]))
            traj[name] = []
        arrays.append(views)
        if segments := traj.get("segments"):  # a key only where there are some (older farms: never)
            segment_arrays[len(arrays) - 1] = [_views(seg, data, traj["job_id"]) for seg in segments]
    page = ResultsPage.model_validate(header)
    trajs = [item.trajectory for item in page.items if item.trajectory is not None]
    for out, views in zip(trajs, arrays, strict=True):
        out.token_ids, out.logprobs, out.loss_mask = views
    for index, views_of_segments in segment_arrays.items():
        for segment, views in zip(trajs[index].segments, views_of_segments, strict=True):
            segment.token_ids, segment.logprobs, segment.loss_mask = views
    return page


def _views(arrays: dict[str, Any], data: memoryview, job_id: int) -> list[RawArray]:
    """The views of ``data`` that ``arrays``' references name (a trajectory's or a segment's), each
    reference replaced by an empty list.

    Raises:
        ApiError: a reference runs past the page's end.
    """
    views = []
    for name in _ARRAY_FIELDS:
        ref = arrays[name]
        end = ref["offset"] + ref["length"] * _ITEMSIZE[ref["dtype"]]
        if end > len(data):
            raise ApiError(200, "bad_page", f"job {job_id}'s {name} runs past the page's end")
        views.append(RawArray(dtype=ref["dtype"], data=data[ref["offset"] : end]))
        # Validated as an empty list, then set: a RawArray in the union costs pydantic more
        # (it tries the other branches first) than the rest of the page.
        arrays[name] = []
    return views


def is_binary(response: httpx.Response) -> bool:
    content_type: str = response.headers.get("content-type", "")
    return content_type.split(";")[0].strip() == RESULTS_MEDIA_TYPE


def body_buffer(response: httpx.Response) -> npt.NDArray[np.uint8] | None:
    """Where to read a binary page's body, not read yet: a NumPy buffer of its Content-Length.
    NumPy asks the kernel for huge pages for large arrays, so a page of megabytes costs a few
    page faults instead of one per 4 KB. None: read the body as httpx does (an error, JSON, or a
    body without a plain length)."""
    if not (response.is_success and is_binary(response)) or "content-encoding" in response.headers:
        return None
    try:
        return np.empty(int(response.headers["content-length"]), dtype=np.uint8)
    except (KeyError, ValueError):
        return None


class PageBuffer:
    """A binary page's body, filled chunk by chunk (as httpx hands them over) into the buffer of its
    Content-Length."""

    def __init__(self, buffer: npt.NDArray[np.uint8]) -> None:
        self._view = buffer.data
        self._filled = 0

    def add(self, chunk: bytes) -> None:
        """Append ``chunk``.

        Raises:
            ApiError: the body is longer than its Content-Length.
        """
        end = self._filled + len(chunk)
        if end > len(self._view):
            raise ApiError(200, "bad_page", "the results page is longer than its Content-Length")
        self._view[self._filled : end] = chunk
        self._filled = end

    def page(self) -> ResultsPage:
        """The page, once the whole body is in.

        Raises:
            ApiError: the body is shorter than its Content-Length, or not a binary results page.
        """
        if self._filled != len(self._view):
            raise ApiError(200, "bad_page", f"the results page ended after {self._filled} of {len(self._view)} bytes")
        return decode_page(self._view)
