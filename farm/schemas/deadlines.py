"""What a batch says about time: its limits (per stage, per job, attempts), its quorum and deadline,
and what it reports about its tail (time to a share of the batch, what was cut or carried)."""

from __future__ import annotations

import math
from datetime import datetime
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from farm.schemas.stored import WholeInt

#: the longest any limit or deadline may be: a week.
MAX_LIMIT_S = 7 * 24 * 3600.0

ReadyReason = Literal["quorum", "deadline"]
RestPolicy = Literal["cancel", "carry"]


class BatchLimits(BaseModel):
    """Hard limits on every job of a batch, enforced by the farm whatever the handler does: a job
    past one ends with outcome ``timeout`` (its reason names the stage and the limit) and its sandbox
    is torn down. Unset: the farm's defaults (``worker.init_timeout_s``, ``run_timeout_s``,
    ``eval_timeout_s``, ``job_wall_s``, ``max_attempts``)."""

    model_config = ConfigDict(extra="forbid")

    init_s: float | None = Field(
        default=None, gt=0, le=MAX_LIMIT_S, description="INIT: sandbox boot and task setup, per attempt"
    )
    run_s: float | None = Field(default=None, gt=0, le=MAX_LIMIT_S, description="RUN: the agent loop, per attempt")
    eval_s: float | None = Field(default=None, gt=0, le=MAX_LIMIT_S, description="EVAL: scoring, per attempt")
    job_wall_s: float | None = Field(
        default=None,
        gt=0,
        le=MAX_LIMIT_S,
        description="a job's wall time from its first INIT to its end, every stage and attempt included",
    )
    max_attempts: WholeInt | None = Field(
        default=None, ge=1, le=100, description="attempts per stage (infrastructure retries included)"
    )


class Quorum(BaseModel):
    """How much of the batch the trainer needs and by when. The batch is *ready* once ``min_fraction``
    of its jobs (or ``min_jobs``) have finished, or ``deadline_s`` after it was submitted, whichever
    comes first; the jobs still going then are cancelled or carried, as ``rest`` says."""

    model_config = ConfigDict(extra="forbid")

    min_fraction: float | None = Field(default=None, gt=0, le=1, description="share of the batch's jobs needed")
    min_jobs: WholeInt | None = Field(default=None, ge=1, le=1_000_000, description="or a number of jobs")
    deadline_s: float | None = Field(
        default=None, gt=0, le=MAX_LIMIT_S, description="seconds after submit when the batch is ready regardless"
    )
    rest: RestPolicy = Field(
        default="cancel",
        description="cancel: the jobs still going are stopped at once (reason recorded); carry: they keep running "
        "and are served later past the batch's ready_seq, each with the weight versions that sampled its tokens",
    )

    @model_validator(mode="after")
    def _one_bound(self) -> Quorum:
        if self.min_fraction is not None and self.min_jobs is not None:
            raise ValueError("give min_fraction or min_jobs, not both")
        if self.min_fraction is None and self.min_jobs is None and self.deadline_s is None:
            raise ValueError("give min_fraction, min_jobs or deadline_s")
        return self

    def needed(self, total_jobs: int) -> int:
        """Jobs the quorum needs of ``total_jobs`` (a deadline alone needs them all)."""
        if self.min_jobs is not None:
            return min(self.min_jobs, total_jobs)
        if self.min_fraction is not None:
            # Rounded up, with a little slack for float error (0.95 * 100 is 95.00000000000001).
            return min(total_jobs, max(1, math.ceil(self.min_fraction * total_jobs - 1e-9)))
        return total_jobs


class Readiness(BaseModel):
    """Where a batch with a quorum stands for its trainer."""

    ready: bool
    reason: ReadyReason | None = Field(description="quorum: enough jobs finished; deadline: deadline_s passed first")
    ready_at: datetime | None
    ready_seq: int | None = Field(
        description="results 1..ready_seq are the batch's step; later ones are carried (or cut) jobs"
    )
    needed: int = Field(description="jobs the quorum needs")
    rest: RestPolicy
    carried: int = Field(description="jobs left running at ready (rest carry)")
    cut: int = Field(description="jobs stopped at ready (rest cancel)")


class TailShare(BaseModel):
    """What one part of a batch (its step, its carried jobs, its cut jobs) holds, by task."""

    jobs: int
    mean_tokens: float | None = Field(description="mean trajectory length, of those that have one")
    mean_turns: float | None = Field(description="mean model turns, of those that have a trajectory")


class TaskTail(BaseModel):
    """One task's jobs, split as the batch's readiness split them."""

    task: str = Field(description="the task's name, else its type and group index")
    step: TailShare
    carried: TailShare
    cut: TailShare


class BatchTail(BaseModel):
    """A batch's tail: time from submit to a share of its jobs finished, and what fell past ready."""

    batch_id: int
    total_jobs: int
    seconds_to: dict[str, float | None] = Field(
        description="seconds from submit until 50/90/99/100% of the jobs finished (not cut); None: not yet"
    )
    readiness: Readiness | None
    pool: TailShare = Field(description="every finished job with a trajectory (the no-bias reference)")
    step: TailShare
    carried: TailShare
    cut: TailShare
    by_task: list[TaskTail]
