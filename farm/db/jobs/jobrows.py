"""The job row under the state machine, shared by claims, completions and the rest of the
lifecycle: locking it, setting columns, legal moves, and finish positions in the batch.

Lock order is always job rows first, then the batch row, so two writers cannot deadlock.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any, Protocol

from sqlalchemy import Connection

from farm.constants import TERMINAL_STATES, JobState, Outcome, Stage
from farm.db.jobs import statements as sql
from farm.db.models import STATE_TIMESTAMP, check_transition
from farm.errors import ClaimLost

STAGE_STATE = sql.STAGE_STATE
STATE_STAGE = sql.STATE_STAGE
PREVIOUS_STATE = sql.PREVIOUS_STATE
NEXT_STAGE = {Stage.INIT: Stage.RUN, Stage.RUN: Stage.EVAL}
#: the error of an attempt whose lease lapsed.
LOST_ERROR = "the worker stopped renewing its lease (killed or hung)"


# The row types below say what a statement's row holds, by name: SQLAlchemy's Row types its
# columns by position only, and answers any attribute with Any. A Row is accepted where one of
# these is expected, so a statement must select what its row type names; tests/unit/
# test_state_machine.py checks each against its statement and the model's column types.


class GrantedRow(Protocol):
    """What a claim hands on of the job row: the usual claim's RETURNING (``sql.GRANTED_COLUMNS``
    and the group's config), or a job row locked with its task."""

    id: int
    batch_id: int
    type: str
    node: str | None
    seed: int | None
    stage_data: dict[str, Any]
    created_at: datetime
    outcome: Outcome | None
    reason: str | None
    init_at: datetime | None
    config: dict[str, Any]


class JobRow(Protocol):
    """A job row as the state machine reads it (``sql.JOB_COLUMNS``)."""

    id: int
    batch_id: int
    group_id: int
    type: str
    state: JobState
    stage_done: bool
    lease_until: datetime | None
    worker: str | None
    stage_attempts: int
    attempts: int
    node: str | None
    seed: int | None
    stage_data: dict[str, Any]
    stage_started_at: datetime | None
    outcome: Outcome | None
    reason: str | None
    task_id: str | None
    created_at: datetime
    restarts: int
    init_at: datetime | None


class TaskJobRow(JobRow, Protocol):
    """A job row with its group's task config and its batch's sampling (``sql.LOCK_JOB_WITH_TASK``)."""

    config: dict[str, Any]
    sampling: dict[str, Any]
    history: str
    limits: dict[str, Any] | None
    quorum: dict[str, Any] | None


def lock(session: Connection, job_id: int) -> JobRow | None:
    """The job row, locked."""
    return session.execute(sql.LOCK_JOB, {"job_id": job_id}).one_or_none()


def lock_with_task(session: Connection, job_id: int) -> TaskJobRow | None:
    """The job row, locked, with its group's config and its batch's sampling."""
    return session.execute(sql.LOCK_JOB_WITH_TASK, {"job_id": job_id}).one_or_none()


def set_values(session: Connection, job_id: int, **values: Any) -> None:
    session.execute(sql.UPDATE_JOB, {"_job_id": job_id, **values})


def move(job_id: int, current: JobState, to: JobState, now: datetime) -> dict[str, Any]:
    """Column values for a legal move of a job to ``to`` (raises InvalidTransition otherwise)."""
    check_transition(job_id, current, to)
    values: dict[str, Any] = {"state": to}
    if column := STATE_TIMESTAMP.get(to):
        values[column] = now
    if to in TERMINAL_STATES:
        values.update(finished_at=now, lease_until=None, stage_started_at=None)
    return values


def commit_early(session: Connection) -> None:
    """Let this transaction's commit return before PostgreSQL has its WAL on disk (~2 ms less
    per commit), as ``claim_next`` and ``complete_next`` on an autocommit engine without flush
    waits do. Only for writes a database crash may lose without harm, because something notices
    and redoes them: a lost claim is found by the stage's own completion (ClaimLost, the message
    is delivered again), a lost INIT or RUN completion by the lease sweeper. Every commit that
    finishes a job still waits, and it carries any earlier write with it (the WAL is written in
    order)."""
    if session.dialect.name == "postgresql":
        session.exec_driver_sql("SET LOCAL synchronous_commit TO OFF")


def owned_attempt(session: Connection, job_id: int, stage: Stage, worker: str) -> tuple[JobRow | None, str]:
    """The locked job if this worker still owns ``stage`` of it; else None and why not."""
    job = lock(session, job_id)
    if job is None:
        return None, "job vanished"
    if job.state is JobState.CANCELLED:
        return None, "cancelled"
    if job.state is PREVIOUS_STATE[stage] and job.stage_done:
        # Nothing moves a job back: the database lost the claim (see commit_early).
        raise ClaimLost(f"the claim of {stage.value} was lost", job_id=job_id)
    if job.state is not STAGE_STATE[stage] or job.stage_done or job.worker != worker:
        return None, "lease lost: another worker took the stage over"
    return job, ""


def finish(
    session: Connection, job: JobRow, state: JobState, *, now: datetime, outcome: Outcome, reason: str | None
) -> None:
    """Move a locked job to a terminal state, at the next place in its batch's finish order
    (taken now, under the batch row lock)."""
    values = move(job.id, job.state, state, now)
    seq = take_finish_seqs(session, job.batch_id, 1, now)
    set_values(session, job.id, **values, outcome=outcome, reason=reason, finish_seq=seq)


def take_finish_seq(session: Connection, job_id: int, batch_id: int, now: datetime) -> None:
    """Give a finished job (locked by this transaction) the next place in its batch's finish order."""
    if session.dialect.name == "postgresql":
        session.execute(sql.FINISH_AT_NEXT_SEQ, {"_job_id": job_id, "_batch_id": batch_id, "_count": 1, "_now": now})
    else:
        set_values(session, job_id, finish_seq=take_finish_seqs(session, batch_id, 1, now))


def take_finish_seqs(session: Connection, batch_id: int, count: int, now: datetime) -> int:
    """Reserve ``count`` finish positions under the batch row lock; returns the first one.
    The same statement marks a running batch complete when these were its last jobs.

    Taking them under the lock makes finish order equal commit order within a batch, so a
    results cursor never skips a job that commits late."""
    finished = session.execute(sql.TAKE_FINISH_SEQS, {"_batch_id": batch_id, "_count": count, "_now": now}).scalar_one()
    return int(finished) - count + 1
