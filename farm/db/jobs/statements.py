"""The statements of the job state machine (``farm.db.jobs.claims``, ``.completions``, ``.lifecycle``),
built once.

Building a SQLAlchemy expression costs more Python than running it, and these run several
times per stage of every job. Statements without ``values()`` SET whichever columns their
parameters name; their own bind parameters start with ``_`` so they never clash with one.
"""

from __future__ import annotations

from functools import cache
from typing import Any, cast

from sqlalchemy import (
    BindParameter,
    Insert,
    Select,
    Table,
    and_,
    bindparam,
    case,
    exists,
    func,
    insert,
    literal,
    select,
    update,
)
from sqlalchemy import cast as sql_cast
from sqlalchemy.dialects.postgresql import insert as pg_insert
from sqlalchemy.dialects.sqlite import insert as sqlite_insert
from sqlalchemy.sql.dml import ReturningUpdate
from sqlalchemy.sql.elements import Cast

from farm.constants import BatchState, JobState, Stage
from farm.db.base import UTCDateTime
from farm.db.models import STATE_TIMESTAMP, TRANSITIONS, Batch, Group, Job, StageRun, Trajectory

JOBS, RUNS, BATCHES, GROUPS, TRAJECTORIES = (
    cast(Table, model.__table__) for model in (Job, StageRun, Batch, Group, Trajectory)
)

STAGE_STATE = {Stage.INIT: JobState.INIT, Stage.RUN: JobState.RUN, Stage.EVAL: JobState.EVAL}
PREVIOUS_STATE = {Stage.INIT: JobState.QUEUED, Stage.RUN: JobState.INIT, Stage.EVAL: JobState.RUN}
#: the stage a job in each of these states is running (or waiting for).
STATE_STAGE = {state: stage for stage, state in STAGE_STATE.items()}

#: what the lifecycle reads of a job row.
JOB_COLUMNS = [
    JOBS.c[name]
    for name in (
        "id",
        "batch_id",
        "group_id",
        "type",
        "state",
        "stage_done",
        "lease_until",
        "worker",
        "stage_attempts",
        "attempts",
        "node",
        "seed",
        "stage_data",
        "stage_started_at",
        "outcome",
        "reason",
        "task_id",
        "created_at",
        "restarts",
        "init_at",
    )
]
#: what a claim hands on of the job row (``claims._granted``): the usual claim returns only
#: these, as every returned column costs result processing on each claim.
GRANTED_COLUMNS = [
    JOBS.c[name]
    for name in ("id", "batch_id", "type", "node", "seed", "stage_data", "created_at", "outcome", "reason", "init_at")
]
LOCK_JOB = select(*JOB_COLUMNS).where(JOBS.c.id == bindparam("job_id")).with_for_update()
LOCK_JOB_WITH_TASK = (
    select(*JOB_COLUMNS, GROUPS.c.config, BATCHES.c.sampling, BATCHES.c.history, BATCHES.c.limits, BATCHES.c.quorum)
    .join(GROUPS, GROUPS.c.id == JOBS.c.group_id)
    .join(BATCHES, BATCHES.c.id == JOBS.c.batch_id)
    .where(JOBS.c.id == bindparam("job_id"))
    .with_for_update(of=JOBS)
)
SAMPLING_OF_BATCH = select(BATCHES.c.sampling, BATCHES.c.history, BATCHES.c.limits, BATCHES.c.quorum).where(
    BATCHES.c.id == bindparam("batch_id")
)
#: the job's task config, read by the claim's own statement (a RETURNING subquery).
_CONFIG_OF_GROUP = (
    select(GROUPS.c.config).where(GROUPS.c.id == JOBS.c.group_id).correlate(JOBS).scalar_subquery().label("config")
)
UPDATE_JOB = update(JOBS).where(JOBS.c.id == bindparam("_job_id"))
#: a completion's guard: the attempt it claimed is still running. The attempt number alone is
#: not enough: a node's hand-on starts a job over at attempt 0 (``farm.db.nodes``), so a cut-off
#: worker's attempt can have the number of the new worker's.
_OWNED_ATTEMPT = (
    JOBS.c.id == bindparam("_job_id"),
    JOBS.c.state == bindparam("_state"),
    JOBS.c.stage_done.is_(False),
    JOBS.c.worker == bindparam("_worker"),
    JOBS.c.stage_attempts == bindparam("_attempt"),
)
UPDATE_OWNED_ATTEMPT = update(JOBS).where(*_OWNED_ATTEMPT)
INSERT_RUN = insert(RUNS)
RENEW_LEASES = (
    update(JOBS)
    .where(
        JOBS.c.id.in_(bindparam("ids", expanding=True)),
        JOBS.c.worker == bindparam("_worker"),
        JOBS.c.stage_done.is_(False),
        JOBS.c.state.in_(list(STAGE_STATE.values())),
    )
    .values(lease_until=bindparam("_until"))
    .returning(JOBS.c.id)
)
_COMPLETES_BATCH = and_(
    BATCHES.c.finished_jobs + bindparam("_count") >= BATCHES.c.total_jobs,
    BATCHES.c.state == BatchState.RUNNING,
    # A dynamic batch ends when its groups say so (farm.db.dynamic), not when its jobs run out.
    BATCHES.c.dynamic.is_(None),
)
TAKE_FINISH_SEQS = (
    update(BATCHES)
    .where(BATCHES.c.id == bindparam("_batch_id"))
    .values(
        finished_jobs=BATCHES.c.finished_jobs + bindparam("_count"),
        # SET expressions read the row as it was, so this is "the last jobs of a running batch".
        state=case((_COMPLETES_BATCH, literal(BatchState.COMPLETE, BATCHES.c.state.type)), else_=BATCHES.c.state),
        finished_at=case((_COMPLETES_BATCH, bindparam("_now", type_=UTCDateTime())), else_=BATCHES.c.finished_at),
    )
    .returning(BATCHES.c.finished_jobs)
)
#: what EVAL reads of RUN's trajectory.
TRAJECTORY_ARRAYS = ("token_ids", "logprobs", "loss_mask", "turn_offsets", "weight_versions", "segments", "info")
LOAD_TRAJECTORY = select(*(TRAJECTORIES.c[name] for name in TRAJECTORY_ARRAYS)).where(
    TRAJECTORIES.c.job_id == bindparam("job_id")
)
SCORE_TRAJECTORY = update(TRAJECTORIES).where(TRAJECTORIES.c.job_id == bindparam("_job_id"))


#: RUN's episode, read by EVAL's claim in its own statement (RETURNING subqueries).
_TRAJECTORY_OF_JOB = [
    select(TRAJECTORIES.c[name]).where(TRAJECTORIES.c.job_id == JOBS.c.id).correlate(JOBS).scalar_subquery().label(name)
    for name in TRAJECTORY_ARRAYS
]


def _claim_next(stage: Stage) -> ReturningUpdate[Any]:
    """The usual claim: the previous stage is done (so the job is neither cancelled nor finished
    nor claimed by anyone), and the job moves into ``stage`` in one statement."""
    previous, target = PREVIOUS_STATE[stage], STAGE_STATE[stage]
    # The lifecycle skips check_transition on this path: these moves are always legal.
    assert target in TRANSITIONS[previous]
    now = bindparam("_now", type_=UTCDateTime())
    values: dict[str, Any] = {
        "state": target,
        STATE_TIMESTAMP[target]: now,
        "stage_started_at": now,
        "stage_attempts": 1,
        "attempts": JOBS.c.attempts + 1,
        "stage_done": False,
        "worker": bindparam("_worker"),
        "lease_until": bindparam("_until", type_=UTCDateTime()),
    }
    if stage is Stage.INIT:
        values["node"] = bindparam("_node")
    return (
        update(JOBS)
        .where(JOBS.c.id == bindparam("_job_id"), JOBS.c.state == previous, JOBS.c.stage_done.is_(True))
        .values(values)
        .returning(*GRANTED_COLUMNS, _CONFIG_OF_GROUP, *(_TRAJECTORY_OF_JOB if stage is Stage.EVAL else ()))
    )


CLAIM_NEXT = {stage: _claim_next(stage) for stage in Stage}

_TRAJECTORY_VALUES = (
    "num_tokens",
    "token_ids",
    "logprobs",
    "loss_mask",
    "turn_offsets",
    "weight_versions",
    "segments",
    "info",
    "reward",
    "metrics",
    "timings",
)


@cache
def upsert_trajectory(dialect: str) -> Insert:
    """Insert a trajectory, or overwrite the one a previous attempt of RUN left."""
    statement = (pg_insert if dialect == "postgresql" else sqlite_insert)(TRAJECTORIES)
    return statement.on_conflict_do_update(
        index_elements=[TRAJECTORIES.c.job_id], set_={name: statement.excluded[name] for name in _TRAJECTORY_VALUES}
    )


#: a stage_runs row, as the completion writes it.
RUN_ROW = ("job_id", "stage", "attempt", "status", "node", "worker", "started_at", "finished_at", "error")
#: a trajectory row, as RUN writes it.
TRAJECTORY_ROW = ("job_id", "created_at", *_TRAJECTORY_VALUES)
#: what EVAL adds to the trajectory.
SCORE_ROW = ("reward", "metrics", "info", "timings")


def _bind(table: Table, prefix: str, name: str) -> BindParameter[Any]:
    return bindparam(f"{prefix}{name}", type_=table.c[name].type)


def _value(table: Table, prefix: str, name: str) -> Cast[Any]:
    # Typed explicitly: in a SELECT list a parameter has no column to take its type from (a
    # NULL would arrive as text).
    return sql_cast(_bind(table, prefix, name), table.c[name].type)


@cache
def complete_owned(stage: Stage, columns: tuple[str, ...], finishes: bool) -> Select[Any]:
    """PostgreSQL: a completion in one statement. The job UPDATE guarded like
    UPDATE_OWNED_ATTEMPT (SET ``columns`` from ``_set_<name>``), and, only for the row it
    updated, the attempt's stage_runs row (``_run_<name>``) and the trajectory write (RUN's
    ``_trajectory_<name>``, EVAL's ``_score_<name>``). Selects 1 if the attempt was still owned.

    A completion that ``finishes`` the job also takes its place in the batch's finish order
    (``_batch_id``, ``_count`` 1, ``_now``; see TAKE_FINISH_SEQS). The job row is locked first
    (the ``guard``), and the batch row only if the guard found it, so the lock order stays job,
    then batch, and a completion that lost its attempt takes no place.
    """
    values: dict[str, Any] = {name: _bind(JOBS, "_set_", name) for name in columns}
    if finishes:
        guard = select(JOBS.c.id).where(*_OWNED_ATTEMPT).with_for_update().cte("guard")
        seq = TAKE_FINISH_SEQS.where(exists(select(guard.c.id))).cte("seq")
        values["finish_seq"] = select(seq.c.finished_jobs).scalar_subquery()
        owned_rows = update(JOBS).where(JOBS.c.id.in_(select(guard.c.id)))
    else:
        owned_rows = update(JOBS).where(*_OWNED_ATTEMPT)
    owned = owned_rows.values(values).returning(JOBS.c.id).cte("owned")
    writes = [
        insert(RUNS)
        .from_select(RUN_ROW, select(owned.c.id, *(_value(RUNS, "_run_", name) for name in RUN_ROW[1:])))
        .cte("attempt")
    ]
    if stage is Stage.RUN:
        rows = select(owned.c.id, *(_value(TRAJECTORIES, "_trajectory_", name) for name in TRAJECTORY_ROW[1:]))
        upsert = pg_insert(TRAJECTORIES).from_select(TRAJECTORY_ROW, rows)
        set_ = {name: upsert.excluded[name] for name in _TRAJECTORY_VALUES}
        writes.append(upsert.on_conflict_do_update(index_elements=[TRAJECTORIES.c.job_id], set_=set_).cte("trajectory"))
    if stage is Stage.EVAL:
        score = (
            update(TRAJECTORIES)
            .where(TRAJECTORIES.c.job_id.in_(select(owned.c.id)))
            .values({name: _bind(TRAJECTORIES, "_score_", name) for name in SCORE_ROW})
        )
        writes.append(score.cte("score"))
    return select(func.count()).select_from(owned).add_cte(*writes)


_SEQ = TAKE_FINISH_SEQS.cte("seq")
#: PostgreSQL: take the next finish position of the job's batch and give it to the job, in one
#: statement (the job row is already locked, so the lock order stays job, then batch).
FINISH_AT_NEXT_SEQ = (
    update(JOBS)
    .where(JOBS.c.id == bindparam("_job_id"))
    .values(finish_seq=select(_SEQ.c.finished_jobs).scalar_subquery())
)
