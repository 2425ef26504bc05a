"""A batch as the trainer submits it (tasks, sampling, dynamic sampling) and as the farm reports it."""

from __future__ import annotations

import hashlib
import json
from datetime import datetime
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from farm.constants import BatchState, JobState, Outcome
from farm.schemas.deadlines import BatchLimits, Quorum, Readiness
from farm.schemas.stored import INT64_MAX, INT64_MIN, METADATA_ABOUT, StoredJson, StoredMetadata, StoredStr, WholeInt
from farm.schemas.trials import DEFAULT_HISTORY, TrialHistory


class SamplingParams(BaseModel):
    """Sampling for every LLM turn of a job, as the backends understand it."""

    model_config = ConfigDict(extra="forbid")

    temperature: float = Field(default=1.0, ge=0.0, le=10.0)
    top_p: float = Field(default=1.0, gt=0.0, le=1.0)
    top_k: WholeInt = Field(default=-1, ge=-1, json_schema_extra={"not": {"const": 0}}, description="-1: off")
    max_tokens: WholeInt = Field(default=1024, ge=1, le=1_000_000, description="per LLM turn")
    stop_token_ids: list[Annotated[WholeInt, Field(ge=INT64_MIN, le=INT64_MAX)]] = Field(default_factory=list)
    seed: WholeInt | None = Field(
        default=None, ge=INT64_MIN, le=INT64_MAX, description="per-job seeds are derived from it"
    )

    @model_validator(mode="after")
    def _top_k_not_zero(self) -> SamplingParams:
        if self.top_k == 0:
            raise ValueError("top_k must be -1 (off) or >= 1")
        return self


class TaskSpec(BaseModel):
    """One prompt of a batch: a task type (handler name) and its config, validated by that handler."""

    model_config = ConfigDict(extra="forbid")

    type: StoredStr = Field(min_length=1, max_length=200, description="an installed task type, e.g. 'math' or 'echo'")
    config: StoredJson = Field(default_factory=dict, description="validated by the handler's config_class")
    name: StoredStr | None = Field(default=None, max_length=500, description="the trainer's own id for this prompt")


#: the group filters every farm has (more come from the ``farm.filters`` entry points).
BUILTIN_FILTERS = ("std", "mixed", "min_spread")


class PassRateSkip(BaseModel):
    """Leave out prompts the pass-rate ledger says teach nothing."""

    model_config = ConfigDict(extra="forbid")

    after_tries: WholeInt = Field(
        ge=1,
        le=1_000_000,
        description="skip a prompt whose pass rate is exactly 0 or 1 after at least this many scored samples",
    )


class DynamicSampling(BaseModel):
    """DAPO dynamic sampling: the batch's tasks are a pool; groups are started from it, a few at a
    time, until ``target_groups`` groups pass the filter (their rewards differ); the rest stop."""

    model_config = ConfigDict(extra="forbid")

    target_groups: WholeInt = Field(ge=1, le=1_000_000, description="informative groups wanted")
    max_groups_in_flight: WholeInt | None = Field(
        default=None, ge=1, le=100_000, description="groups running at once (default: target_groups)"
    )
    filter: str = Field(
        default="std",
        min_length=1,
        max_length=200,
        pattern=r"^[A-Za-z0-9_.:-]+$",
        description="std: rewards not all equal; mixed: at least one success and one failure; min_spread: "
        "max - min reward >= min_spread; or a filter another package registers (entry points farm.filters)",
    )
    min_spread: float = Field(default=0.0, ge=0.0, le=1e9, description="for filter min_spread")
    success_at: float = Field(
        default=1.0, ge=-1e9, le=1e9, description="a sample with at least this reward is a success (mixed, pass rates)"
    )
    skip: PassRateSkip | None = Field(default=None, description="leave out prompts stuck at a pass rate of 0 or 1")


def task_key(task_type: str, config: dict[str, Any], name: str | None = None) -> str:
    """A prompt's key in the pass-rate ledger: the trainer's ``name`` for it, else a hash of what it is
    (type and config, canonical JSON), so the same prompt has the same key in every batch."""
    if name:
        return f"name:{name}"[:200]
    body = json.dumps({"type": task_type, "config": config}, sort_keys=True, separators=(",", ":"))
    return "sha256:" + hashlib.sha256(body.encode()).hexdigest()


class BatchCreate(BaseModel):
    """What a trainer submits: each task becomes one group of ``group_size`` jobs."""

    model_config = ConfigDict(extra="forbid")

    tasks: list[TaskSpec] = Field(min_length=1)
    group_size: WholeInt = Field(default=1, ge=1, le=1024)
    sampling: SamplingParams = Field(default_factory=SamplingParams)
    metadata: StoredMetadata = Field(default_factory=dict, description=METADATA_ABOUT)
    max_staleness: WholeInt | None = Field(
        default=None,
        ge=0,
        le=1_000_000,
        description="a rollout whose oldest sampled token is more than this many weight versions behind the "
        "newest when its RUN ends is handled as `on_stale` says; unset: no bound",
    )
    on_stale: Literal["rerun", "mark"] = Field(
        default="rerun",
        description="rerun: RUN again on the newest weights (up to the worker's max_attempts, then kept "
        "marked); mark: keep it, with `stale` true on the job",
    )
    dynamic: DynamicSampling | None = Field(
        default=None, description="DAPO dynamic sampling: the tasks are a pool to draw informative groups from"
    )
    history: TrialHistory = Field(
        default=DEFAULT_HISTORY,
        description="what the next prompt is where the chat template rewrites earlier turns (Qwen3 drops past "
        "reasoning): exact keeps every sampled id (one segment per episode); template is what the template renders "
        "(each rewrite starts a segment, every segment is returned). A harness task's own harness.history wins",
    )
    limits: BatchLimits | None = Field(
        default=None,
        description="hard limits per stage, per job (wall, every attempt) and on attempts; a job past one ends with "
        "outcome timeout; unset fields: the farm's defaults",
    )
    quorum: Quorum | None = Field(
        default=None,
        description="the share of the batch the trainer needs and by when; the rest is cancelled or carried",
    )


class BatchCreated(BaseModel):
    id: int
    job_ids: list[int]
    created: bool = Field(description="false when an earlier submission with the same idempotency key is returned")


class DynamicStatus(BaseModel):
    """Where a dynamic batch stands."""

    target_groups: int
    pool: int = Field(description="tasks in the pool")
    started: int = Field(description="groups started so far")
    running: int
    informative: int
    uninformative: int
    failed: int = Field(description="groups with fewer than two scored samples (infrastructure failures)")
    skipped: int = Field(description="prompts left out by the pass-rate ledger")
    end_reason: Literal["target_reached", "pool_exhausted"] | None


class BatchStatus(BaseModel):
    id: int
    state: BatchState
    created_at: datetime
    finished_at: datetime | None
    group_size: int
    total_jobs: int
    finished_jobs: int
    counts: dict[JobState, int] = Field(description="jobs per state")
    outcomes: dict[Outcome, int] = Field(description="finished jobs per outcome")
    metadata: dict[str, Any]
    history: TrialHistory = DEFAULT_HISTORY
    dynamic: DynamicStatus | None = None
    reward_mean: float | None = Field(default=None, description="mean reward of the scored jobs (none scored: null)")
    scored: int = Field(default=0, description="jobs with a reward")
    sampled_tokens: int | None = Field(
        default=None, description="tokens the model sampled in the batch's recorded episodes (null: not known)"
    )
    tokens_per_s: float | None = Field(
        default=None, description="sampled tokens per second since the batch was enqueued (to its end, if ended)"
    )
    elapsed_s: float = Field(default=0.0, description="seconds since the batch was enqueued (to its end, if ended)")
    eta_s: float | None = Field(
        default=None,
        description="seconds left at the pace so far (running batches with a job finished; DAPO may end sooner)",
    )
    limits: BatchLimits | None = Field(default=None, description="the limits the batch set (unset: the farm's)")
    readiness: Readiness | None = Field(default=None, description="for a batch with a quorum: is it ready, and why")


class PassRate(BaseModel):
    """A prompt's record across batches: scored samples and how many were successes."""

    task_key: str
    type: str
    tries: int
    successes: int
    rate: float
