"""Batches, groups, jobs (a state machine), stage attempts and trajectories.

Token arrays are stored as raw little-endian bytes (int32 ids, float32 logprobs, uint8
mask): a 32k-token trajectory is ~290 kB and loads with one ``numpy.frombuffer``, where
a JSON list of the same numbers is ~3x bigger and ~50x slower to parse.
"""

from __future__ import annotations

from datetime import datetime
from enum import Enum
from typing import Any

from sqlalchemy import JSON, Boolean, Float, ForeignKey, Index, Integer, LargeBinary, String, Text, false, text
from sqlalchemy import Enum as SAEnum
from sqlalchemy.orm import Mapped, mapped_column, relationship

from farm.constants import BatchState, JobState, Outcome, PauseOutcome, Stage, StageStatus
from farm.db.base import Base, BigId, UTCDateTime, utcnow
from farm.errors import InvalidTransition


def _enum(cls: type[Enum]) -> SAEnum:
    # Stored as the lowercase value in a plain VARCHAR: readable in psql, no native enum to migrate.
    return SAEnum(cls, native_enum=False, length=32, values_callable=lambda e: [m.value for m in e])


#: the legal moves of a job; anything else raises InvalidTransition. The way back to ``queued``
#: is taken only when the node holding the job's sandbox is lost (``farm.db.nodes``).
TRANSITIONS: dict[JobState, frozenset[JobState]] = {
    JobState.QUEUED: frozenset({JobState.INIT, JobState.FAILED, JobState.CANCELLED}),
    JobState.INIT: frozenset({JobState.RUN, JobState.QUEUED, JobState.FAILED, JobState.CANCELLED}),
    JobState.RUN: frozenset({JobState.EVAL, JobState.QUEUED, JobState.FAILED, JobState.CANCELLED}),
    JobState.EVAL: frozenset({JobState.DONE, JobState.QUEUED, JobState.FAILED, JobState.CANCELLED}),
    JobState.DONE: frozenset(),
    JobState.FAILED: frozenset(),
    JobState.CANCELLED: frozenset(),
}

STATE_TIMESTAMP = {JobState.INIT: "init_at", JobState.RUN: "run_at", JobState.EVAL: "eval_at"}


def check_transition(job_id: int, current: JobState, to: JobState) -> None:
    """Raise InvalidTransition unless ``current -> to`` is a move of the state machine."""
    if to not in TRANSITIONS[current]:
        raise InvalidTransition(f"job {job_id} cannot go from {current.value} to {to.value}", job_id=job_id)


class Batch(Base):
    """One trainer submission."""

    __tablename__ = "batches"

    id: Mapped[int] = mapped_column(BigId, primary_key=True)
    idempotency_key: Mapped[str | None] = mapped_column(String(200), unique=True)
    request_hash: Mapped[str | None] = mapped_column(String(64))
    state: Mapped[BatchState] = mapped_column(_enum(BatchState), default=BatchState.RUNNING)
    group_size: Mapped[int] = mapped_column(Integer)
    sampling: Mapped[dict[str, Any]] = mapped_column(JSON)
    meta: Mapped[dict[str, Any]] = mapped_column("metadata", JSON, default=dict)
    total_jobs: Mapped[int] = mapped_column(Integer)
    #: also the batch's finish counter: a job's finish_seq is taken from it under the row lock,
    #: so finish order equals commit order and a results cursor never skips a job.
    finished_jobs: Mapped[int] = mapped_column(Integer, default=0)
    created_at: Mapped[datetime] = mapped_column(UTCDateTime, default=utcnow)
    #: set once INIT was sent for every job: an idempotent resubmit re-sends when it is missing.
    enqueued_at: Mapped[datetime | None] = mapped_column(UTCDateTime)
    finished_at: Mapped[datetime | None] = mapped_column(UTCDateTime)
    #: a rollout whose oldest sampled token is more than this many weight versions behind the
    #: newest when RUN ends is ``on_stale``: re-run, or kept and marked stale. None: no bound.
    max_staleness: Mapped[int | None] = mapped_column(Integer)
    on_stale: Mapped[str | None] = mapped_column(String(16))
    #: the history policy every stage of the batch follows (``farm.schemas.trials.TrialHistory``).
    history: Mapped[str] = mapped_column(String(16), default="exact", server_default="exact")
    #: DAPO dynamic sampling (``farm.schemas.DynamicSampling``); None: every group runs.
    dynamic: Mapped[dict[str, Any] | None] = mapped_column(JSON(none_as_null=True))
    #: a dynamic batch's progress, moved by one UPDATE per decided group (``farm.db.dynamic``).
    pool_cursor: Mapped[int] = mapped_column(Integer, default=0, server_default="0")
    groups_started: Mapped[int] = mapped_column(Integer, default=0, server_default="0")
    groups_informative: Mapped[int] = mapped_column(Integer, default=0, server_default="0")
    groups_uninformative: Mapped[int] = mapped_column(Integer, default=0, server_default="0")
    groups_failed: Mapped[int] = mapped_column(Integer, default=0, server_default="0")
    groups_skipped: Mapped[int] = mapped_column(Integer, default=0, server_default="0")
    #: why a dynamic batch ended: target_reached or pool_exhausted.
    end_reason: Mapped[str | None] = mapped_column(String(32))
    #: the limits the batch set (``farm.schemas.BatchLimits``, unset fields left out); None: the farm's.
    limits: Mapped[dict[str, Any] | None] = mapped_column(JSON(none_as_null=True))
    #: the batch's quorum and deadline (``farm.schemas.Quorum``); None: it is ready when it is complete.
    quorum: Mapped[dict[str, Any] | None] = mapped_column(JSON(none_as_null=True))
    #: when the quorum was met or the deadline passed (``farm.deadlines.ready``), and which; the
    #: commit that sets them also cancels the rest (rest cancel) or leaves it running (carry).
    ready_at: Mapped[datetime | None] = mapped_column(UTCDateTime)
    ready_reason: Mapped[str | None] = mapped_column(String(16))
    #: finish positions 1..ready_seq are the batch's step; later ones were carried or cut.
    ready_seq: Mapped[int | None] = mapped_column(Integer)

    groups: Mapped[list[Group]] = relationship(back_populates="batch", order_by="Group.index")


class Group(Base):
    """The ``group_size`` rollouts of one task."""

    __tablename__ = "groups"

    id: Mapped[int] = mapped_column(BigId, primary_key=True)
    batch_id: Mapped[int] = mapped_column(ForeignKey("batches.id", ondelete="CASCADE"), index=True)
    index: Mapped[int] = mapped_column(Integer)
    type: Mapped[str] = mapped_column(String(200))
    config: Mapped[dict[str, Any]] = mapped_column(JSON)
    name: Mapped[str | None] = mapped_column(String(500))
    #: dynamic batches only: pending (in the pool), running, then informative, uninformative,
    #: failed (too few scored samples), skipped (the ledger left it out) or stopped (target reached).
    state: Mapped[str | None] = mapped_column(String(16))
    started_at: Mapped[datetime | None] = mapped_column(UTCDateTime)
    decided_at: Mapped[datetime | None] = mapped_column(UTCDateTime)
    reward_mean: Mapped[float | None] = mapped_column(Float)
    reward_std: Mapped[float | None] = mapped_column(Float)
    #: an informative group's position in its batch's group results (1, 2, ...).
    result_seq: Mapped[int | None] = mapped_column(Integer)

    batch: Mapped[Batch] = relationship(back_populates="groups")


class Job(Base):
    """One rollout. ``state`` names the stage that owns the job: waiting for it while
    ``stage_done`` is true for the previous state, running it while a lease is held."""

    __tablename__ = "jobs"
    # No index may cover a column that claims and completions change (state, lease_until,
    # worker, ...): PostgreSQL then updates the row in place (HOT), in the room the fill factor
    # leaves on its page, instead of writing into every index six times per job (migration 0003).
    __table_args__ = (
        Index("ix_jobs_batch_finish", "batch_id", "finish_seq"),
        {"postgresql_with": {"fillfactor": 60}},
    )

    id: Mapped[int] = mapped_column(BigId, primary_key=True)
    batch_id: Mapped[int] = mapped_column(ForeignKey("batches.id", ondelete="CASCADE"))
    group_id: Mapped[int] = mapped_column(ForeignKey("groups.id", ondelete="CASCADE"), index=True)
    group_index: Mapped[int] = mapped_column(Integer)
    sample_index: Mapped[int] = mapped_column(Integer)
    type: Mapped[str] = mapped_column(String(200))
    seed: Mapped[int | None] = mapped_column(BigId)
    state: Mapped[JobState] = mapped_column(_enum(JobState), default=JobState.QUEUED)
    #: the stage named by ``state`` has finished and the next one may claim the job.
    stage_done: Mapped[bool] = mapped_column(Boolean, default=True)
    outcome: Mapped[Outcome | None] = mapped_column(_enum(Outcome))
    reason: Mapped[str | None] = mapped_column(Text)
    attempts: Mapped[int] = mapped_column(Integer, default=0)
    stage_attempts: Mapped[int] = mapped_column(Integer, default=0)
    node: Mapped[str | None] = mapped_column(String(200))
    worker: Mapped[str | None] = mapped_column(String(200))
    #: while a stage runs: its lease. While the next stage is owed (``stage_done`` and not final):
    #: when the reconciler sends its message again if no worker has claimed it by then.
    lease_until: Mapped[datetime | None] = mapped_column(UTCDateTime)
    #: times the job started over from INIT because the node that held its sandbox was lost.
    restarts: Mapped[int] = mapped_column(Integer, default=0, server_default="0")
    task_id: Mapped[str | None] = mapped_column(String(64))
    #: when the attempt in progress began; its stage_runs row is written only when it ends
    #: (one INSERT instead of an INSERT at the claim and an UPDATE at the end).
    stage_started_at: Mapped[datetime | None] = mapped_column(UTCDateTime)
    #: {"state": what the handler passes between stages, "timings": seconds per stage}.
    stage_data: Mapped[dict[str, Any]] = mapped_column(JSON, default=dict)
    reward: Mapped[float | None] = mapped_column(Float)
    #: RUN ended with the rollout past its batch's ``max_staleness`` (and it was not re-run).
    stale: Mapped[bool] = mapped_column(Boolean, default=False, server_default=false())
    finish_seq: Mapped[int | None] = mapped_column(Integer)
    created_at: Mapped[datetime] = mapped_column(UTCDateTime, default=utcnow)
    init_at: Mapped[datetime | None] = mapped_column(UTCDateTime)
    run_at: Mapped[datetime | None] = mapped_column(UTCDateTime)
    eval_at: Mapped[datetime | None] = mapped_column(UTCDateTime)
    finished_at: Mapped[datetime | None] = mapped_column(UTCDateTime)

    stages: Mapped[list[StageRun]] = relationship(order_by="StageRun.id", cascade="all, delete-orphan")


class PassRateRow(Base):
    """A prompt's running pass rate across batches (``farm.db.dynamic``): scored samples and successes."""

    __tablename__ = "pass_rates"

    task_key: Mapped[str] = mapped_column(String(200), primary_key=True)
    type: Mapped[str] = mapped_column(String(200))
    tries: Mapped[int] = mapped_column(Integer, default=0)
    successes: Mapped[int] = mapped_column(Integer, default=0)
    updated_at: Mapped[datetime] = mapped_column(UTCDateTime, default=utcnow)


class Node(Base):
    """A node's last sign of life: every worker process on it writes ``seen_at`` each sweep
    interval. A node with jobs past INIT and no sign of life for ``worker.node_lost_s`` is lost."""

    __tablename__ = "nodes"

    name: Mapped[str] = mapped_column(String(200), primary_key=True)
    seen_at: Mapped[datetime] = mapped_column(UTCDateTime)
    #: since when it has reported without a gap: only a node heard from throughout the bound may
    #: call another node lost (after a database outage every node is silent, none is lost).
    beating_since: Mapped[datetime] = mapped_column(UTCDateTime)
    #: when its jobs were last handed on (restarted or failed) because it was lost.
    lost_at: Mapped[datetime | None] = mapped_column(UTCDateTime)


class Teardown(Base):
    """A teardown the farm owes: a job ended (cancelled) while its sandbox was on ``node``.
    Written by the commit that ends the job, deleted when a worker on the node has torn it down;
    until then the reconciler sends the job's stage message to the node again at ``due_at``."""

    __tablename__ = "teardowns"

    job_id: Mapped[int] = mapped_column(ForeignKey("jobs.id", ondelete="CASCADE"), primary_key=True)
    node: Mapped[str] = mapped_column(String(200))
    #: the stage whose message reaches the node (its claim finds the job ended and tears down).
    stage: Mapped[Stage] = mapped_column(_enum(Stage))
    due_at: Mapped[datetime] = mapped_column(UTCDateTime)


class LLMBackend(Base):
    """A registered LLM backend: the balancer's set in Redis is rebuilt from these rows when
    Redis comes back empty (load and health are live figures and stay in Redis)."""

    __tablename__ = "backends"

    id: Mapped[str] = mapped_column(String(200), primary_key=True)
    url: Mapped[str] = mapped_column(String(2000))
    kind: Mapped[str] = mapped_column(String(32))
    model: Mapped[str | None] = mapped_column(String(500))
    capacity: Mapped[int] = mapped_column(Integer)
    #: the weights it serves: set when it registers, moved by a weight update.
    weight_version: Mapped[int] = mapped_column(Integer, default=0, server_default="0")
    created_at: Mapped[datetime] = mapped_column(UTCDateTime, default=utcnow)


class WeightUpdate(Base):
    """A trainer's weight update: backends paused, weights loaded, backends resumed at a new version.

    The row is the farm's record of what it owes the backends. ``phase`` moves ``pausing -> paused
    (-> loading -> loaded) -> resuming -> done``; an update the trainer abandons (past ``deadline``)
    or cancels goes ``rolling_back -> rolled_back``: every backend resumes with the version of the
    weights it holds. Only ``is_open`` updates are in progress, at most one at a time (a unique
    partial index), and any API process finishes one it finds in ``resuming`` or ``rolling_back``.
    """

    __tablename__ = "weight_updates"
    __table_args__ = (
        Index(
            "uq_weight_updates_open",
            "is_open",
            unique=True,
            postgresql_where=text("is_open"),
            sqlite_where=text("is_open"),
        ),
    )

    id: Mapped[int] = mapped_column(BigId, primary_key=True)
    #: wait (in-flight turns finish first), keep (frozen, continue after resume), abort (re-issued after).
    mode: Mapped[str] = mapped_column(String(8))
    phase: Mapped[str] = mapped_column(String(16))
    is_open: Mapped[bool] = mapped_column(Boolean, default=True)
    #: what proxy calls do while paused: wait, or reject with a retryable 503.
    proxy: Mapped[str] = mapped_column(String(8), default="wait")
    from_version: Mapped[int] = mapped_column(Integer)
    to_version: Mapped[int | None] = mapped_column(Integer)
    #: where the backends loaded the new weights from (a directory they can read), if the farm loaded them.
    load_path: Mapped[str | None] = mapped_column(Text)
    #: past this, an update still waiting for the trainer is rolled back (or finished where loaded).
    deadline: Mapped[datetime] = mapped_column(UTCDateTime)
    error: Mapped[str | None] = mapped_column(Text)
    created_at: Mapped[datetime] = mapped_column(UTCDateTime, default=utcnow)
    updated_at: Mapped[datetime] = mapped_column(UTCDateTime, default=utcnow)
    finished_at: Mapped[datetime | None] = mapped_column(UTCDateTime)

    backends: Mapped[list[WeightUpdateBackend]] = relationship(
        order_by="WeightUpdateBackend.backend_id", cascade="all, delete-orphan"
    )


class WeightUpdateBackend(Base):
    """One backend's acknowledgements in a weight update."""

    __tablename__ = "weight_update_backends"

    update_id: Mapped[int] = mapped_column(ForeignKey("weight_updates.id", ondelete="CASCADE"), primary_key=True)
    backend_id: Mapped[str] = mapped_column(String(200), primary_key=True)
    #: the version of the weights it holds now (from_version until it loaded the new ones).
    version: Mapped[int] = mapped_column(Integer)
    paused_at: Mapped[datetime | None] = mapped_column(UTCDateTime)
    loaded_at: Mapped[datetime | None] = mapped_column(UTCDateTime)
    resumed_at: Mapped[datetime | None] = mapped_column(UTCDateTime)
    #: how its pause ended; None until its answer was recorded (an update that died while ``pausing``).
    pause_outcome: Mapped[PauseOutcome | None] = mapped_column(_enum(PauseOutcome))
    error: Mapped[str | None] = mapped_column(Text)


class StageRun(Base):
    """One finished attempt at one stage of a job: who ran it, when, and how it ended. The
    attempt in progress has no row yet; the job view shows it from the job row."""

    __tablename__ = "stage_runs"

    id: Mapped[int] = mapped_column(BigId, primary_key=True)
    job_id: Mapped[int] = mapped_column(ForeignKey("jobs.id", ondelete="CASCADE"), index=True)
    stage: Mapped[Stage] = mapped_column(_enum(Stage))
    attempt: Mapped[int] = mapped_column(Integer)
    status: Mapped[StageStatus] = mapped_column(_enum(StageStatus), default=StageStatus.RUNNING)
    node: Mapped[str | None] = mapped_column(String(200))
    worker: Mapped[str | None] = mapped_column(String(200))
    started_at: Mapped[datetime] = mapped_column(UTCDateTime, default=utcnow)
    finished_at: Mapped[datetime | None] = mapped_column(UTCDateTime)
    error: Mapped[str | None] = mapped_column(Text)


class Trajectory(Base):
    """The token-exact episode of a job; at most one per job (a re-run overwrites it)."""

    __tablename__ = "trajectories"

    job_id: Mapped[int] = mapped_column(ForeignKey("jobs.id", ondelete="CASCADE"), primary_key=True)
    num_tokens: Mapped[int] = mapped_column(Integer)
    token_ids: Mapped[bytes] = mapped_column(LargeBinary)
    logprobs: Mapped[bytes] = mapped_column(LargeBinary)
    loss_mask: Mapped[bytes] = mapped_column(LargeBinary)
    turn_offsets: Mapped[bytes] = mapped_column(LargeBinary)
    #: [[version, start, end], ...]: which weights sampled which tokens (``farm.schemas.VersionSpan``).
    weight_versions: Mapped[list[list[int]]] = mapped_column(JSON, default=list, server_default="[]")
    #: the episode's other segments (``TrajectoryData.segments``), packed by ``farm.db.arrays.pack_segments``;
    #: NULL when it has none (one segment: the arrays above).
    segments: Mapped[bytes | None] = mapped_column(LargeBinary)
    reward: Mapped[float | None] = mapped_column(Float)
    metrics: Mapped[dict[str, float]] = mapped_column(JSON, default=dict)
    timings: Mapped[dict[str, float]] = mapped_column(JSON, default=dict)
    info: Mapped[dict[str, Any]] = mapped_column(JSON, default=dict)
    created_at: Mapped[datetime] = mapped_column(UTCDateTime, default=utcnow)


class Trial(Base):
    """One harness episode behind the proxy: its base URL is ``/proxy/{id}/v1`` and its secret key
    (stored only as a SHA-256) opens this trial and nothing else. ``job_id`` ties it to the job
    whose RUN started the harness; a trainer may also create one on its own."""

    __tablename__ = "trials"

    id: Mapped[str] = mapped_column(String(64), primary_key=True)
    key_sha256: Mapped[str] = mapped_column(String(64))
    job_id: Mapped[int | None] = mapped_column(ForeignKey("jobs.id", ondelete="CASCADE"), index=True)
    #: the model name the harness may ask for (any name is accepted; this one is listed).
    model: Mapped[str] = mapped_column(String(500))
    #: sampling settings that override the harness's own (a harness asking for temperature 0 is
    #: still sampled as the trainer wants); keys of ``SamplingParams``.
    sampling: Mapped[dict[str, Any]] = mapped_column(JSON, default=dict)
    #: number of calls started so far: the next call's ``seq``. Taken under the row lock.
    calls: Mapped[int] = mapped_column(Integer, default=0)
    segments: Mapped[int] = mapped_column(Integer, default=0)
    ended_at: Mapped[datetime | None] = mapped_column(UTCDateTime)
    #: why the record cannot be trusted whole (a call whose outcome is unknown); None when complete.
    incomplete: Mapped[str | None] = mapped_column(Text)
    meta: Mapped[dict[str, Any]] = mapped_column("metadata", JSON, default=dict)
    created_at: Mapped[datetime] = mapped_column(UTCDateTime, default=utcnow)


#: one finished child per parent and segment: a second is a branch (``trials.finish_call``).
DONE_CHILD_INDEX = "uq_trial_calls_done_child"


class TrialCall(Base):
    """One model call of a trial, token-exact. ``delta_ids`` are the prompt tokens beyond the
    parent call's end (the parent's prompt + its sampled ids), or the whole prompt when the call
    starts a segment; so a call's prompt is rebuilt from its ancestors without storing any token
    twice. ``end_hash`` chains the canonical messages of the request plus the reply given, so a
    later request that extends this conversation finds this call by one index lookup."""

    __tablename__ = "trial_calls"
    __table_args__ = (
        Index("ix_trial_calls_end", "trial_id", "end_hash"),
        Index(
            DONE_CHILD_INDEX,
            "trial_id",
            "segment",
            "parent_seq",
            unique=True,
            postgresql_where=text("state = 'done'"),
            sqlite_where=text("state = 'done'"),
        ),
    )

    trial_id: Mapped[str] = mapped_column(ForeignKey("trials.id", ondelete="CASCADE"), primary_key=True)
    seq: Mapped[int] = mapped_column(Integer, primary_key=True)
    segment: Mapped[int] = mapped_column(Integer)
    parent_seq: Mapped[int | None] = mapped_column(Integer)
    #: pending (generating), done (recorded; the answer went out after this), failed (no answer given).
    state: Mapped[str] = mapped_column(String(16), default="pending")
    wire: Mapped[str] = mapped_column(String(32))
    #: the answer was streamed: part of it may reach the harness before the call is recorded.
    streamed: Mapped[bool] = mapped_column(Boolean, default=False)
    #: 16-byte chained hash per request message (diagnoses where a new segment diverged).
    message_hashes: Mapped[bytes] = mapped_column(LargeBinary)
    end_hash: Mapped[bytes | None] = mapped_column(LargeBinary)
    delta_ids: Mapped[bytes] = mapped_column(LargeBinary)
    #: the request's messages beyond what the parent covered (all of them when the call starts a
    #: segment), as chat templates read them; None for calls recorded before they were kept.
    messages: Mapped[list[dict[str, Any]] | None] = mapped_column(JSON)
    prompt_tokens: Mapped[int] = mapped_column(Integer)
    sampled_ids: Mapped[bytes] = mapped_column(LargeBinary, default=b"")
    logprobs: Mapped[bytes] = mapped_column(LargeBinary, default=b"")
    finish_reason: Mapped[str | None] = mapped_column(String(32))
    #: the assistant message the harness was given (canonical form, tool-call ids included).
    reply: Mapped[dict[str, Any] | None] = mapped_column(JSON)
    #: how this call relates to the one before it (``farm.proxy.continuity``).
    continuity: Mapped[dict[str, Any]] = mapped_column(JSON, default=dict)
    backend_id: Mapped[str | None] = mapped_column(String(200))
    #: [[version, start, end], ...] over the sampled ids.
    weight_versions: Mapped[list[list[int]] | None] = mapped_column(JSON)
    error: Mapped[str | None] = mapped_column(Text)
    started_at: Mapped[datetime] = mapped_column(UTCDateTime, default=utcnow)
    finished_at: Mapped[datetime | None] = mapped_column(UTCDateTime)
    first_token_s: Mapped[float | None] = mapped_column(Float)
    latency_s: Mapped[float | None] = mapped_column(Float)
