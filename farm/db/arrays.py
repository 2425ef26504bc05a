"""Token arrays <-> the compact little-endian bytes stored in the trajectories table."""

from __future__ import annotations

from collections.abc import Sequence
from typing import NamedTuple

import numpy as np

from farm.schemas import ArrayEncoding, B64Array, SegmentData

INT32 = np.dtype("<i4")
FLOAT32 = np.dtype("<f4")
UINT8 = np.dtype("u1")


def pack_ids(values: Sequence[int] | np.ndarray) -> bytes:
    return np.asarray(values, dtype=INT32).tobytes()


def pack_logprobs(values: Sequence[float] | np.ndarray) -> bytes:
    return np.asarray(values, dtype=FLOAT32).tobytes()


def pack_mask(values: Sequence[int] | np.ndarray) -> bytes:
    return np.asarray(values, dtype=UINT8).tobytes()


def unpack_ids(raw: bytes | memoryview) -> list[int]:
    return np.frombuffer(raw, dtype=INT32).tolist()  # type: ignore[no-any-return]


def encode_ids(raw: bytes | memoryview, encoding: ArrayEncoding) -> list[int] | B64Array:
    return B64Array.encode(raw, "int32") if encoding == "b64" else unpack_ids(raw)


def encode_logprobs(raw: bytes | memoryview, encoding: ArrayEncoding) -> list[float] | B64Array:
    if encoding == "b64":
        return B64Array.encode(raw, "float32")
    return np.frombuffer(raw, dtype=FLOAT32).tolist()  # type: ignore[no-any-return]


def encode_mask(raw: bytes | memoryview, encoding: ArrayEncoding) -> list[int] | B64Array:
    if encoding == "b64":
        return B64Array.encode(raw, "uint8")
    return np.frombuffer(raw, dtype=UINT8).tolist()  # type: ignore[no-any-return]


class PackedSegment(NamedTuple):
    """One segment of a packed ``segments`` value: its arrays as views of the stored bytes (ids
    int32, logprobs float32, mask uint8), its turn offsets and its ``[version, start, end]`` spans."""

    token_ids: memoryview
    logprobs: memoryview
    loss_mask: memoryview
    turn_offsets: list[int]
    weight_versions: list[list[int]]


def pack_segments(segments: Sequence[SegmentData]) -> bytes | None:
    """A trajectory's other segments as one bytes value; None when there are none.

    The layout, all little-endian: an int32 header ``[S, n_0, t_0, v_0, ..., n_S-1, t_S-1, v_S-1]``
    (segment count, then each segment's tokens, turns and weight-version spans), then each segment
    in order: token ids (int32 x n), logprobs (float32 x n), turn offsets (int32 x t), spans
    (int32 x 3v), loss mask (uint8 x n). The arrays are the main columns' own encodings, so a
    results page sends each one as it is stored.
    """
    if not segments:
        return None
    header = [len(segments)]
    parts: list[bytes] = []
    for s in segments:
        header += [len(s.token_ids), len(s.turn_offsets), len(s.weight_versions)]
        parts += [
            pack_ids(s.token_ids),
            pack_logprobs(s.logprobs),
            pack_ids(s.turn_offsets),
            pack_ids([x for span in s.weight_versions for x in span]),
            pack_mask(s.loss_mask),
        ]
    return pack_ids(header) + b"".join(parts)


def unpack_segments(raw: bytes | memoryview | None) -> list[PackedSegment]:
    """The segments ``pack_segments`` packed, as views of ``raw`` (none for NULL)."""
    if not raw:
        return []
    view = memoryview(raw).cast("B")
    (count,) = np.frombuffer(view, dtype=INT32, count=1).tolist()
    sizes = np.frombuffer(view, dtype=INT32, count=1 + 3 * count)[1:].reshape(count, 3).tolist()
    at = 4 * (1 + 3 * count)
    out = []
    for n, turns, spans in sizes:
        ids, at = view[at : at + 4 * n], at + 4 * n
        logprobs, at = view[at : at + 4 * n], at + 4 * n
        offsets, at = unpack_ids(view[at : at + 4 * turns]), at + 4 * turns
        flat, at = unpack_ids(view[at : at + 12 * spans]), at + 12 * spans
        mask, at = view[at : at + n], at + n
        out.append(PackedSegment(ids, logprobs, mask, offsets, [flat[i : i + 3] for i in range(0, len(flat), 3)]))
    return out


def segment_data(packed: PackedSegment) -> SegmentData:
    return SegmentData(
        token_ids=unpack_ids(packed.token_ids),
        logprobs=np.frombuffer(packed.logprobs, dtype=FLOAT32).tolist(),
        loss_mask=list(packed.loss_mask),
        turn_offsets=packed.turn_offsets,
        weight_versions=[(v, s, e) for v, s, e in packed.weight_versions],
    )
