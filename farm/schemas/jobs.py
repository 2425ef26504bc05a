"""Jobs and their results: a job's status and stages, its trajectory, and the pages of finished jobs
and informative groups a batch streams back."""

from __future__ import annotations

from datetime import datetime
from typing import Any, Literal

from pydantic import BaseModel, Field
from pydantic.json_schema import SkipJsonSchema

from farm.constants import BatchState, JobState, Outcome, Stage, StageStatus
from farm.schemas.arrays import ArrayEncoding, B64Array, RawArray, VersionSpan


class StageRunOut(BaseModel):
    stage: Stage
    attempt: int
    status: StageStatus
    node: str | None
    worker: str | None
    started_at: datetime
    finished_at: datetime | None
    error: str | None


class JobOut(BaseModel):
    id: int
    batch_id: int
    group_id: int
    group_index: int = Field(description="position of the task in the batch")
    sample_index: int = Field(description="position of the job in its group")
    type: str
    state: JobState
    outcome: Outcome | None
    reason: str | None
    attempts: int
    node: str | None
    reward: float | None
    stale: bool = Field(
        default=False,
        description="RUN ended more than the batch's max_staleness weight versions behind (and was not re-run)",
    )
    created_at: datetime
    init_at: datetime | None
    run_at: datetime | None
    eval_at: datetime | None
    finished_at: datetime | None
    stages: list[StageRunOut] = Field(default_factory=list)


class TrajectorySegmentOut(BaseModel):
    """One of a trajectory's other segments (``TrajectoryOut.segments``): a token sequence of its own,
    with its own prompt, its arrays in the trajectory's ``encoding``."""

    num_tokens: int
    token_ids: list[int] | B64Array | SkipJsonSchema[RawArray]
    logprobs: list[float] | B64Array | SkipJsonSchema[RawArray] = Field(description="0.0 where loss_mask is 0")
    loss_mask: list[int] | B64Array | SkipJsonSchema[RawArray] = Field(description="1 on tokens the model sampled")
    turn_offsets: list[int] = Field(description="start offset of each turn in token_ids")
    weight_versions: list[VersionSpan] = Field(
        default_factory=list, description="[version, start, end] over the segment's own model tokens"
    )


class TrajectoryOut(BaseModel):
    """A finished rollout, token-exact. Arrays are JSON lists or ``B64Array`` (see ``encoding``)."""

    # Read by farm.client from a binary results page, the arrays are RawArray and ``encoding``
    # is "binary": kept out of the JSON schema, since no JSON answer holds them.

    job_id: int
    batch_id: int
    group_id: int
    encoding: ArrayEncoding | SkipJsonSchema[Literal["binary"]]
    num_tokens: int
    token_ids: list[int] | B64Array | SkipJsonSchema[RawArray]
    logprobs: list[float] | B64Array | SkipJsonSchema[RawArray] = Field(description="0.0 where loss_mask is 0")
    loss_mask: list[int] | B64Array | SkipJsonSchema[RawArray] = Field(description="1 on tokens the model sampled")
    turn_offsets: list[int] = Field(description="start offset of each turn in token_ids")
    weight_versions: list[VersionSpan] = Field(
        default_factory=list,
        description="[version, start, end]: tokens start..end-1 were sampled by weight version `version`; "
        "the spans cover the model tokens (loss_mask 1) in order",
    )
    reward: float | None
    metrics: dict[str, float]
    timings: dict[str, float]
    info: dict[str, Any] = Field(default_factory=dict)
    segments: list[TrajectorySegmentOut] = Field(
        default_factory=list,
        description="the episode's other segments, in the order they were made (the arrays above are its main "
        "segment, the one holding its last model turn); empty unless the chat template rewrote earlier turns "
        "under the `template` history policy",
    )


class JobResult(BaseModel):
    """One finished job (done, failed or cancelled) in the results stream."""

    seq: int = Field(description="position in the batch's finish order; pass the last one as `after`")
    job: JobOut
    trajectory: TrajectoryOut | None


class ResultsPage(BaseModel):
    items: list[JobResult]
    next_cursor: int = Field(description="pass as `after` to get the results that finish next")
    batch_state: BatchState
    remaining: int = Field(description="jobs of the batch not finished yet")
    finished: int = Field(description="jobs of the batch finished so far: finish positions 1 to `finished` are taken")
    ready_seq: int | None = Field(
        default=None,
        description="a batch with a quorum, once ready: results 1..ready_seq are its step, later ones carried or cut",
    )


class GroupResult(BaseModel):
    """One informative group of a dynamic batch: every sample's result, and the rewards' spread."""

    seq: int = Field(description="position among the batch's informative groups; pass the last as `after`")
    group_id: int
    index: int = Field(description="the task's position in the pool")
    name: str | None
    reward_mean: float
    reward_std: float
    rewards: list[float]
    results: list[JobResult]


class GroupsPage(BaseModel):
    items: list[GroupResult]
    next_cursor: int
    batch_state: BatchState
    informative: int = Field(description="informative groups found so far")
    target_groups: int
    end_reason: Literal["target_reached", "pool_exhausted"] | None
