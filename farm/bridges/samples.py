"""A finished farm job as one RL sample, in the prompt/response split trainers' rollout workers use.

Framework-neutral (no verl, no torch): ``farm.bridges.verl`` wraps it in verl's own output type.
The prompt is the trajectory's first span (the rendered first messages); the response is everything
after it: the model's turns (mask 1, with the logprobs the backend sampled them with) and what came
between them (tool results and the next generation prompts: mask 0, logprob 0).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

from farm.client.arrays import decode_trajectory
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
    """Split a done job's trajectory into prompt and response.

    A response longer than ``max_response_tokens`` keeps its first tokens (``extra["truncated"]``
    says so): a trainer that pads every response to one length cannot take a longer one.

    Raises:
        SampleFailed: the job has no reward or no trajectory (not the policy's doing).
    """
    job, traj = result.job, result.trajectory
    if traj is None or job.reward is None or job.outcome not in POLICY_OUTCOMES:
        raise SampleFailed(f"job {job.id} ended {job.state.value} ({job.outcome}): {job.reason or 'no reward'}")
    arrays = decode_trajectory(traj)
    offsets = list(traj.turn_offsets)
    # The first span is the rendered prompt unless the first token is already the model's.
    prompt_len = offsets[1] if len(offsets) > 1 and int(arrays.loss_mask[0]) == 0 else 0
    ids = arrays.token_ids.astype(np.int64)
    mask = arrays.loss_mask.astype(np.int64)
    logprobs = np.where(arrays.loss_mask[prompt_len:] > 0, arrays.logprobs[prompt_len:], 0.0).astype(np.float64)
    response = ids[prompt_len:]
    extra: dict[str, Any] = {
        "farm_job_id": job.id,
        "farm_outcome": str(job.outcome),
        "weight_versions": [list(span) for span in traj.weight_versions],
        "stale": job.stale,
    }
    cut = len(response)
    if max_response_tokens is not None and len(response) > max_response_tokens:
        cut, extra["truncated"] = max_response_tokens, True
    return Sample(
        prompt_ids=ids[:prompt_len].tolist(),
        response_ids=response[:cut].tolist(),
        response_mask=mask[prompt_len:][:cut].tolist(),
        response_logprobs=logprobs[:cut].tolist(),
        reward=float(job.reward),
        num_turns=len(offsets),
        extra=extra,
    )
