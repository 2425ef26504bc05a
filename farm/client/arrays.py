"""Trajectories -> padded NumPy arrays a trainer can hand to its model."""

from __future__ import annotations

import binascii
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal

import numpy as np
import numpy.typing as npt

from farm.schemas import B64Array, RawArray, SegmentOut, TrajectoryOut, TrajectorySegmentOut, VersionSpan

#: what ``decode_trajectory`` and ``to_arrays`` take: a job's trajectory, or a segment of a trial's
#: record (``TrialRecord.segment_tokens``; as a model, or the dict of its JSON).
Decodable = TrajectoryOut | SegmentOut | Mapping[str, Any]

_DTYPES: dict[str, np.dtype[Any]] = {"int32": np.dtype("<i4"), "float32": np.dtype("<f4"), "uint8": np.dtype("u1")}


def _array(value: list[int] | list[float] | B64Array | RawArray, dtype: str) -> npt.NDArray[np.generic]:
    if isinstance(value, RawArray):
        # A view of the binary page's bytes: no copy until to_arrays pads it.
        return np.frombuffer(value.data, dtype=_DTYPES[value.dtype])
    if isinstance(value, B64Array):
        # binascii takes the ASCII str as it is (base64.b64decode would first copy it to bytes).
        return np.frombuffer(binascii.a2b_base64(value.b64), dtype=_DTYPES[value.dtype])
    return np.asarray(value, dtype=_DTYPES[dtype])


@dataclass(frozen=True)
class TrajectoryArrays:
    """One trajectory's arrays, unpadded: its main segment, and its other segments (oldest first) in
    ``segments``, each with the trajectory's reward."""

    token_ids: npt.NDArray[np.int32]
    logprobs: npt.NDArray[np.float32]
    loss_mask: npt.NDArray[np.uint8]
    reward: float | None
    weight_versions: Sequence[VersionSpan] = ()
    segments: Sequence[TrajectoryArrays] = ()


def decode_trajectory(traj: Decodable) -> TrajectoryArrays:
    """``traj``'s arrays. A trial record's segment has no reward (None: the harness's grader, if
    any, gives one) and its weight versions, and is one row of ``to_arrays``: a trial's calls each
    extend the one before within a segment, so a segment is one sample; its ``spans`` say which
    call each part came from, and the record's ``certificate`` what each call extended.

    Raises:
        pydantic.ValidationError: a mapping that is not a trial record's segment.
    """
    if isinstance(traj, Mapping):
        traj = SegmentOut.model_validate(traj)
    if isinstance(traj, SegmentOut):
        return TrajectoryArrays(
            token_ids=_array(traj.token_ids, "int32"),  # type: ignore[arg-type]
            logprobs=_array(traj.logprobs, "float32"),  # type: ignore[arg-type]
            loss_mask=_array(traj.loss_mask, "uint8"),  # type: ignore[arg-type]
            reward=None,
            weight_versions=traj.weight_versions,
        )
    return TrajectoryArrays(
        token_ids=_array(traj.token_ids, "int32"),  # type: ignore[arg-type]
        logprobs=_array(traj.logprobs, "float32"),  # type: ignore[arg-type]
        loss_mask=_array(traj.loss_mask, "uint8"),  # type: ignore[arg-type]
        reward=traj.reward,
        weight_versions=traj.weight_versions,
        segments=tuple(_decode_segment(s, traj.reward) for s in traj.segments),
    )


def _decode_segment(segment: TrajectorySegmentOut, reward: float | None) -> TrajectoryArrays:
    return TrajectoryArrays(
        token_ids=_array(segment.token_ids, "int32"),  # type: ignore[arg-type]
        logprobs=_array(segment.logprobs, "float32"),  # type: ignore[arg-type]
        loss_mask=_array(segment.loss_mask, "uint8"),  # type: ignore[arg-type]
        reward=reward,
        weight_versions=segment.weight_versions,
    )


def segment_rows(trajectory: TrajectoryArrays) -> list[TrajectoryArrays]:
    """A trajectory as the samples a step-wise trainer takes: its other segments in the order they
    were made, then its main segment (the one holding its last model turn), each with its reward."""
    return [*trajectory.segments, trajectory]


#: ``versions`` where no weights sampled the token (prompts, observations, padding).
NO_VERSION = -1


#: the padded integer arrays' default dtype: token ids are stored int32, so int32 holds every id
#: and halves the memory int64 would take (``to_arrays(dtype=np.int64)`` for a trainer that wants it).
DEFAULT_INT_DTYPE = np.dtype(np.int32)


def to_arrays(
    trajectories: Sequence[Decodable | TrajectoryArrays],
    *,
    pad_side: Literal["left", "right"] = "right",
    pad_token_id: int = 0,
    max_len: int | None = None,
    dtype: npt.DTypeLike = DEFAULT_INT_DTYPE,
    versions: bool = False,
    segments: Literal["main", "all"] = "main",
) -> dict[str, npt.NDArray[np.generic]]:
    """Pad a batch of trajectories to one length.

    Returns ``input_ids``, ``attention_mask`` and ``loss_mask`` (B x T, of ``dtype``: int32 unless
    asked otherwise), ``old_logprobs`` (float32, B x T, 0 outside the loss mask), ``rewards``
    (float32, B; NaN where a trajectory has none) and ``lengths`` (int64, B). Sequences longer
    than ``max_len`` keep their first ``max_len`` tokens and are flagged in ``truncated``.

    With ``versions``, also ``weight_versions`` (int32, B x T): the weight version that sampled each
    token, ``NO_VERSION`` (-1) on tokens no model sampled and on padding; a trainer computes staleness
    (current version minus it) or picks per-version reference weights from it. A turn that a weight
    update reached mid-decode (pause mode ``keep``) has two versions within it.

    Token ids are stored as int32, so int32 loses nothing and moves half the bytes of int64 (to
    the device too). PyTorch's ``gather`` and ``cross_entropy`` take int64 indices: convert on the
    device (``.long()``), or pass ``dtype=np.int64``.

    ``segments`` says which of a trajectory's segments become rows. A trajectory has more than one
    only where the chat template rewrote earlier turns under the ``template`` history policy (each
    rewrite starts a segment, with its own prompt). ``"main"`` (the default): one row per
    trajectory, its main segment, the one holding its last model turn. ``"all"``: one row per
    segment (each trajectory's other segments in the order they were made, then its main one), the
    trajectory's reward repeated on each, plus ``trajectory_index`` (int64, R: the row's trajectory,
    its position in ``trajectories``) and ``main_segment`` (bool, R). A GRPO trainer computes the
    advantage per trajectory (``rewards[main_segment]``) and broadcasts it to the rows with
    ``advantages[trajectory_index]``.

    A trial record's segments (``to_arrays(record.segment_tokens, versions=True)``) are one row
    each, with ``rewards`` NaN (a trial has none of its own) and their weight versions.

    Raises:
        ValueError: empty input, an unknown ``pad_side`` or ``segments``, or a ``dtype`` that is
            not an integer type.
    """
    if not trajectories:
        raise ValueError("to_arrays needs at least one trajectory")
    if pad_side not in ("left", "right"):
        raise ValueError(f"pad_side must be 'left' or 'right', not {pad_side!r}")
    if segments not in ("main", "all"):
        raise ValueError(f"segments must be 'main' or 'all', not {segments!r}")
    int_dtype = np.dtype(dtype)
    if int_dtype.kind not in "iu":
        raise ValueError(f"dtype must be an integer type, not {int_dtype}")
    decoded = [t if isinstance(t, TrajectoryArrays) else decode_trajectory(t) for t in trajectories]
    owners: list[int] = []
    if segments == "all":
        per_trajectory = [segment_rows(t) for t in decoded]
        owners = [i for i, rows in enumerate(per_trajectory) for _ in rows]
        decoded = [row for rows in per_trajectory for row in rows]
    full = np.array([len(t.token_ids) for t in decoded], dtype=np.int64)
    lengths = np.minimum(full, max_len) if max_len is not None else full
    width = int(lengths.max())
    batch = len(decoded)
    # Zeroed allocations leave the padding's pages untouched (the OS gives them zeroed).
    input_ids = np.zeros((batch, width), dtype=int_dtype)
    if pad_token_id != 0:
        input_ids.fill(pad_token_id)
    attention = np.zeros((batch, width), dtype=int_dtype)
    loss = np.zeros((batch, width), dtype=int_dtype)
    logprobs = np.zeros((batch, width), dtype=np.float32)
    for row, (t, n) in enumerate(zip(decoded, lengths, strict=True)):
        cols = slice(0, n) if pad_side == "right" else slice(width - n, width)
        mask = t.loss_mask[:n]
        input_ids[row, cols] = t.token_ids[:n]
        attention[row, cols] = 1
        loss[row, cols] = mask
        # The contract: 0 outside the loss mask (masking only the row's tokens; padding stays 0).
        np.multiply(t.logprobs[:n], mask, out=logprobs[row, cols], casting="unsafe")
    rewards = np.array([np.nan if t.reward is None else t.reward for t in decoded], dtype=np.float32)
    out: dict[str, npt.NDArray[np.generic]] = {
        "input_ids": input_ids,
        "attention_mask": attention,
        "loss_mask": loss,
        "old_logprobs": logprobs,
        "rewards": rewards,
        "lengths": lengths,
        "truncated": full > lengths,
    }
    if versions:
        out["weight_versions"] = _versions(decoded, lengths, width, pad_side)
    if segments == "all":
        out["trajectory_index"] = np.array(owners, dtype=np.int64)
        # A trajectory's main segment is its last row.
        out["main_segment"] = np.append(out["trajectory_index"][1:] != out["trajectory_index"][:-1], True)
    return out


def _versions(
    decoded: Sequence[TrajectoryArrays], lengths: npt.NDArray[np.int64], width: int, pad_side: str
) -> npt.NDArray[np.int32]:
    grid = np.full((len(decoded), width), NO_VERSION, dtype=np.int32)
    for row, (t, n) in enumerate(zip(decoded, lengths, strict=True)):
        shift = 0 if pad_side == "right" else width - int(n)
        for version, start, end in t.weight_versions:
            end = min(end, int(n))
            if start < end:
                grid[row, shift + start : shift + end] = version
    return grid
