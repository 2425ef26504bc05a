"""The binary results page: the stored array bytes as they are, behind a JSON header.

A client asks for it with ``Accept: application/vnd.farm.results``; everyone else gets JSON.
The layout (docs/api.md, "Binary results pages"):

    bytes 0-3     RESULTS_MAGIC, b"FRP1"
    bytes 4-7     H, the header's length in bytes (uint32, little-endian)
    bytes 8-8+H   the header: UTF-8 JSON, the JSON page's fields, with each trajectory's
                  ``encoding`` "binary" and its token_ids, logprobs and loss_mask (and those of
                  each of its ``segments``, a key present only when it has some) as
                  {"dtype", "offset", "length"}; padded with spaces so the data starts aligned
    then          the data: each array's little-endian bytes, at ``offset`` bytes from the
                  data's start, ``length`` elements long, every one at a multiple of RESULTS_ALIGN

The arrays are copied from the database rows untouched: nothing is decoded or re-encoded.
"""

from __future__ import annotations

import struct
from collections.abc import Iterator
from typing import Any

import pydantic_core
from starlette.responses import Response
from starlette.types import Receive, Scope, Send

from farm.db.arrays import unpack_ids, unpack_segments
from farm.db.reads import ResultRows
from farm.schemas import RESULTS_ALIGN, RESULTS_MAGIC, RESULTS_MEDIA_TYPE, ArrayDtype

#: a binary page goes out in writes of about this size: one per piece costs the event loop
#: more than the copy, one for the page is a buffer of megabytes.
SEND_CHUNK_BYTES = 1 << 20
#: the q a media range gives when it names none.
_DEFAULT_Q = 1.0
#: each array column of a trajectory row, with its dtype and item size.
_ARRAYS: list[tuple[str, ArrayDtype, int]] = [
    ("token_ids", "int32", 4),
    ("logprobs", "float32", 4),
    ("loss_mask", "uint8", 1),
]


def _quality(params: list[str]) -> float:
    for param in params:
        name, _, value = param.partition("=")
        if name.strip().lower() == "q":
            try:
                return min(max(float(value.strip()), 0.0), 1.0)
            except ValueError:
                return 0.0
    return _DEFAULT_Q


def wants_binary(accept: str | None) -> bool:
    """Whether an Accept header asks for the binary page: it names the binary type with q > 0 and
    at least the q JSON gets. Wildcards never select it, so no generic client gets bytes it did
    not ask for; a missing, malformed or unsupported Accept gets JSON (the default)."""
    if not accept:
        return False
    binary_q, json_q = 0.0, 0.0
    for media_range in accept.split(","):
        kind, *params = media_range.split(";")
        kind = kind.strip().lower()
        q = _quality(params)
        if kind == RESULTS_MEDIA_TYPE:
            binary_q = max(binary_q, q)
        elif kind in ("application/json", "application/*", "*/*"):
            json_q = max(json_q, q)
    return binary_q > 0 and binary_q >= json_q


def binary_page(rows: ResultRows, *, after: int) -> list[bytes | memoryview]:
    """One results page in the binary layout (see the module docstring), as the pieces to send in
    order: the head (magic, length, header), then each array as the database gave it, with padding.
    Sent piece by piece, a page is never copied into one buffer (a page of trajectories runs to
    megabytes, and each fresh buffer that size costs the kernel more than the copy)."""
    chunks: list[bytes | memoryview] = []
    size = 0

    def put(raw: bytes | memoryview, dtype: ArrayDtype, itemsize: int) -> dict[str, Any]:
        nonlocal size
        ref = {"dtype": dtype, "offset": size, "length": len(raw) // itemsize}
        chunks.append(raw)
        size += len(raw)
        if pad := -size % RESULTS_ALIGN:
            chunks.append(bytes(pad))
            size += pad
        return ref

    items = []
    for seq, job, row in rows.items:
        traj = None
        if row is not None:
            traj = {
                "job_id": job.id,
                "batch_id": job.batch_id,
                "group_id": job.group_id,
                "encoding": "binary",
                "num_tokens": row.num_tokens,
                **{name: put(getattr(row, name), dtype, itemsize) for name, dtype, itemsize in _ARRAYS},
                "turn_offsets": unpack_ids(row.turn_offsets),
                "weight_versions": row.weight_versions or [],
                "reward": row.reward,
                "metrics": row.metrics,
                "timings": row.timings,
                "info": row.info,
            }
            if row.segments:  # absent, not empty, where there are none: old readers and the common case pay nothing
                traj["segments"] = [
                    {
                        "num_tokens": len(seg.loss_mask),
                        "token_ids": put(seg.token_ids, "int32", 4),
                        "logprobs": put(seg.logprobs, "float32", 4),
                        "loss_mask": put(seg.loss_mask, "uint8", 1),
                        "turn_offsets": seg.turn_offsets,
                        "weight_versions": seg.weight_versions,
                    }
                    for seg in unpack_segments(row.segments)
                ]
        items.append({"seq": seq, "job": job, "trajectory": traj})
    header = {
        "items": items,
        "next_cursor": items[-1]["seq"] if items else after,
        "batch_state": rows.state,
        "remaining": rows.remaining,
        "finished": rows.finished,
    }
    if rows.ready_seq is not None:  # a batch with a quorum, once ready; absent otherwise, as before
        header["ready_seq"] = rows.ready_seq
    # NaN and infinity become null, as in the JSON answer (pydantic's default).
    text = pydantic_core.to_json(header, inf_nan_mode="null")
    text += b" " * (-(len(RESULTS_MAGIC) + 4 + len(text)) % RESULTS_ALIGN)
    return [RESULTS_MAGIC + struct.pack("<I", len(text)) + text, *chunks]


def _writes(pieces: list[bytes | memoryview]) -> Iterator[bytes]:
    """The pieces of a page joined into writes of about SEND_CHUNK_BYTES."""
    chunk: list[bytes | memoryview] = []
    size = 0
    for piece in pieces:
        chunk.append(piece)
        size += len(piece)
        if size >= SEND_CHUNK_BYTES:
            yield b"".join(chunk)
            chunk, size = [], 0
    if chunk:
        yield b"".join(chunk)


class BinaryPageResponse(Response):
    """A binary page (the pieces ``binary_page`` gives) sent in writes of about SEND_CHUNK_BYTES.

    Not a StreamingResponse: that one runs each answer in a task group with a task listening for
    the client going away, which costs more than sending a small page, and the page is in memory
    already (when the client goes away, the server drops the writes left)."""

    media_type = RESULTS_MEDIA_TYPE

    def __init__(self, pieces: list[bytes | memoryview], headers: dict[str, str]) -> None:
        self.status_code = 200
        self.background = None
        self._pieces = pieces
        self.init_headers({**headers, "Content-Length": str(sum(map(len, pieces)))})

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        await send({"type": "http.response.start", "status": self.status_code, "headers": self.raw_headers})
        writes = list(_writes(self._pieces))
        for i, chunk in enumerate(writes, start=1):
            await send({"type": "http.response.body", "body": chunk, "more_body": i < len(writes)})
