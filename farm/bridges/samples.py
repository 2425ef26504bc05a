"""A finished farm job as one RL sample, in the prompt/response split trainers' rollout workers use.

Framework-neutral (no verl, no torch): ``farm.bridges.verl`` wraps it in verl's own output type.
``to_sequences`` gives the whole-sequence shape instead (ids, loss mask, logprobs over the full row,
as TRL's ``RolloutSample`` holds them): ``farm.bridges.trl`` wraps that.
The prompt is the trajectory's first span (the rendered first messages); the response is everything
after it: the model's turns (mask 1, with the logprobs the backend sampled them with) and what came
between them (tool results and the next generation prompts: mask 0, logprob 0).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

import numpy as np
import numpy.typing as npt

from farm.client.arrays import TrajectoryArrays, decode_trajectory, segment_rows
from farm.constants import POLICY_OUTCOMES
from farm.errors import SampleFailed
from farm.schemas import JobResult


@dataclass
class Sample:
    prompt_ids: list[int]
    response_ids: list[int]
    response_mask: list[int]
    response_logprobs: list[float]
    reward: float
    num_turns: int
    #: what a trainer may want to log or filter on: job id, outcome, weight versions, truncation.
    extra: dict[str, Any] = field(default_factory=dict)


def to_sample(result: JobResult, *, max_response_tokens: int | None = None) -> Sample:
    """Split a done job's trajectory (its main segment) into prompt and response.

    A response longer than ``max_response_tokens`` keeps its first tokens (``extra["truncated"]``
    says so): a trainer that pads every response to one length cannot take a longer one.
    ``extra["farm_segments"]`` is how many segments the trajectory has: more than 1 only under the
    ``template`` history policy, where this sample is the last of them (``to_samples`` gives all).

    Raises:
        SampleFailed: the job has no reward or no trajectory (not the policy's doing).
    """
    return to_samples(result, max_response_tokens=max_response_tokens, segments="main")[0]


def to_samples(
    result: JobResult, *, max_response_tokens: int | None = None, segments: Literal["main", "all"] = "all"
) -> list[Sample]:
    """A done job as samples, one per segment with ``segments="all"`` (its other segments in the
    order they were made, then its main one; the reward on each, ``extra["farm_segment"]`` the
    position), or its main segment alone with ``"main"``.

    Raises:
        SampleFailed: the job has no reward or no trajectory (not the policy's doing).
    """
    job, traj = result.job, result.trajectory
    if traj is None or job.reward is None or job.outcome not in POLICY_OUTCOMES:
        raise SampleFailed(f"job {job.id} ended {job.state.value} ({job.outcome}): {job.reason or 'no reward'}")
    main = decode_trajectory(traj)
    count = len(traj.segments) + 1
    parts: list[tuple[TrajectoryArrays, Sequence[int]]] = [(main, traj.turn_offsets)]
    if segments == "all":
        others = zip(main.segments, traj.segments, strict=True)
        parts = [*((arrays, out.turn_offsets) for arrays, out in others), *parts]
    samples: list[Sample] = []
    for arrays, offsets in parts:
        extra: dict[str, Any] = {
            "farm_job_id": job.id,
            "farm_outcome": str(job.outcome),
            "farm_segments": count,
            "stale": job.stale,
        }
        if segments == "all":
            extra["farm_segment"] = len(samples)
        samples.append(_split(arrays, list(offsets), float(job.reward), extra, max_response_tokens))
    return samples


def _split(
    arrays: TrajectoryArrays,
    offsets: list[int],
    reward: float,
    extra: dict[str, Any],
    max_response_tokens: int | None,
) -> Sample:
    """One segment as prompt and response."""
    # The first span is the rendered prompt unless the first token is already the model's.
    prompt_len = offsets[1] if len(offsets) > 1 and int(arrays.loss_mask[0]) == 0 else 0
    ids = arrays.token_ids.astype(np.int64)
    mask = arrays.loss_mask.astype(np.int64)
    logprobs = np.where(arrays.loss_mask[prompt_len:] > 0, arrays.logprobs[prompt_len:], 0.0).astype(np.float64)
    response = ids[prompt_len:]
    extra["weight_versions"] = [list(span) for span in arrays.weight_versions]
    cut = len(response)
    if max_response_tokens is not None and len(response) > max_response_tokens:
        cut, extra["truncated"] = max_response_tokens, True
    return Sample(
        prompt_ids=ids[:prompt_len].tolist(),
        response_ids=response[:cut].tolist(),
        response_mask=mask[prompt_len:][:cut].tolist(),
        response_logprobs=logprobs[:cut].tolist(),
        reward=reward,
        num_turns=len(offsets),
        extra=extra,
    )


#: added to a group's reward spread so a group whose rewards are all equal gets advantage 0, not NaN.
ADVANTAGE_EPS = 1e-8


@dataclass
class TrainingSequence:
    """One training row over the whole sequence: the prompt, the model's turns (mask 1, with the logprobs
    the backend sampled them with) and what came between them (tool results, the next generation
    prompts: mask 0, logprob 0), in the order the model saw them."""

    input_ids: npt.NDArray[np.int64]
    completion_mask: npt.NDArray[np.int64]
    old_log_probs: npt.NDArray[np.float32]
    #: the oldest weight version that sampled a token of the row (None: no model sampled any).
    oldest_version: int | None
    job_id: int
    group_id: int
    reward: float
    #: the row's place among its trajectory's segments (the main one last) and how many there are.
    segment: int
    segments: int


def to_sequences(result: JobResult) -> list[TrainingSequence]:
    """A done job as training rows, one per segment: its other segments in the order they were made,
    then its main one (one row under the ``exact`` history policy), the reward on each.

    Raises:
        SampleFailed: the job has no reward or no trajectory (not the policy's doing).
    """
    job, traj = result.job, result.trajectory
    if traj is None or job.reward is None or job.outcome not in POLICY_OUTCOMES:
        raise SampleFailed(f"job {job.id} ended {job.state.value} ({job.outcome}): {job.reason or 'no reward'}")
    rows = segment_rows(decode_trajectory(traj))
    out = []
    for index, arrays in enumerate(rows):
        mask = arrays.loss_mask.astype(np.int64)
        versions = [int(span[0]) for span in arrays.weight_versions]
        out.append(
            TrainingSequence(
                input_ids=arrays.token_ids.astype(np.int64),
                completion_mask=mask,
                old_log_probs=np.where(mask > 0, arrays.logprobs, 0.0).astype(np.float32),
                oldest_version=min(versions) if versions else None,
                job_id=job.id,
                group_id=job.group_id,
                reward=float(job.reward),
                segment=index,
                segments=len(rows),
            )
        )
    return out


def group_advantages(rewards: Sequence[float]) -> npt.NDArray[np.float64]:
    """Each reward against the others of its group: ``(r - mean) / (std + eps)``, the population std
    (TRL's own rollout worker's formula)."""
    r = np.asarray(rewards, dtype=np.float64)
    if r.size == 0:
        return r
    advantages: npt.NDArray[np.float64] = (r - r.mean()) / (r.std() + ADVANTAGE_EPS)
    return advantages
