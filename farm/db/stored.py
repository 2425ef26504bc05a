"""Jobs read back as their stages stored them, for the CLI tools that run a stage's work again
without the model: ``farm reverify`` (EVAL) and ``farm replay`` (RUN's tool calls).

A job keeps its config in its group and RUN's state in ``jobs.stage_data["state"]``; its batch
keeps the sampling parameters. Its trajectory is read with ``farm.db.jobs.attempts.load_trajectory``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, cast

from sqlalchemy import Connection, Row, select

from farm.constants import JobState, Outcome
from farm.db.models import Batch, Group, Job
from farm.errors import BatchNotFound, JobNotFound
from farm.schemas import SamplingParams
from farm.schemas.trials import TrialHistory

_COLUMNS = (Job.id, Job.batch_id, Job.type, Job.seed, Job.stage_data, Job.outcome, Job.reward, Group.config)
_JOBS = select(*_COLUMNS).join(Group, Group.id == Job.group_id)


@dataclass(frozen=True)
class StoredJob:
    """A job's task, as its group holds it, and what its stages left."""

    job_id: int
    batch_id: int
    type: str
    #: the task config as submitted (not validated: the handler that reads it does that).
    config: dict[str, Any]
    seed: int | None
    #: RUN's state: what EVAL reads (and, for agent tasks, the record of their tool calls).
    state: dict[str, Any]
    outcome: Outcome | None
    reward: float | None


def job(conn: Connection, job_id: int) -> StoredJob:
    """Raises: JobNotFound."""
    row = conn.execute(_JOBS.where(Job.id == job_id)).one_or_none()
    if row is None:
        raise JobNotFound(f"job {job_id} not found", job_id=job_id)
    return _stored(row)


def done_jobs(conn: Connection, batch_id: int) -> list[StoredJob]:
    """The batch's jobs that finished ``done`` (scored), in id order."""
    rows = conn.execute(_JOBS.where(Job.batch_id == batch_id, Job.state == JobState.DONE).order_by(Job.id))
    return [_stored(row) for row in rows]


def sampling(conn: Connection, batch_id: int) -> SamplingParams:
    """Raises: BatchNotFound."""
    row = conn.execute(select(Batch.sampling).where(Batch.id == batch_id)).one_or_none()
    if row is None:
        raise BatchNotFound(f"no batch with id {batch_id}")
    return SamplingParams.model_validate(row.sampling or {})


def history(conn: Connection, batch_id: int) -> TrialHistory:
    """The batch's history policy. Raises: BatchNotFound."""
    row = conn.execute(select(Batch.history).where(Batch.id == batch_id)).one_or_none()
    if row is None:
        raise BatchNotFound(f"no batch with id {batch_id}")
    return cast(TrialHistory, row.history)


def _stored(row: Row[Any]) -> StoredJob:
    return StoredJob(
        job_id=row.id,
        batch_id=row.batch_id,
        type=row.type,
        config=dict(row.config or {}),
        seed=row.seed,
        state=dict((row.stage_data or {}).get("state", {})),
        outcome=row.outcome,
        reward=row.reward,
    )
