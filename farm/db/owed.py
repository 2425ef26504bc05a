"""Stages the farm owes a job, and when their messages are sent again.

A job is owed a stage message in two ways: its next stage is due (``stage_done`` in ``queued``,
``init`` or ``run``: INIT after submit, RUN after INIT, EVAL after RUN), or a stage was given
back with no owner (a retry, or a lease the sweeper found lapsed: ``worker`` NULL). Either way
the commit that creates the debt also writes, in ``lease_until``, when the reconciler sends the
message again if no worker has claimed the stage by then. A claim replaces that time with its
lease; a final state clears it. So PostgreSQL alone says what is owed, and Redis may lose any
message: it is sent again.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

from sqlalchemy import Connection, and_, bindparam, or_, select, update

from farm.constants import BatchState, JobState, Stage
from farm.db.jobs import statements as sql
from farm.db.models import Batch, Job

#: a job in one of these states with ``stage_done`` is owed the next stage.
NEXT_STAGE_OF = {JobState.QUEUED: Stage.INIT, JobState.INIT: Stage.RUN, JobState.RUN: Stage.EVAL}

_OWED = or_(
    and_(Job.stage_done.is_(True), Job.state.in_(list(NEXT_STAGE_OF))),
    and_(Job.stage_done.is_(False), Job.worker.is_(None), Job.state.in_(list(sql.STATE_STAGE))),
)
_POSTPONE = (
    update(Job)
    .where(Job.id.in_(bindparam("ids", expanding=True)), _OWED)
    .values(lease_until=bindparam("until"))
    .execution_options(synchronize_session=False)
)


@dataclass(frozen=True)
class Owed:
    """A stage message a job is owed: where it goes, and the task id it was first sent with
    (kept, so a cancel's revoke covers every copy)."""

    job_id: int
    batch_id: int
    stage: Stage
    node: str | None
    task_id: str | None


def due(conn: Connection, *, before: datetime, limit: int = 500) -> list[Owed]:
    """Owed stages whose resend time is before ``before``, oldest first, locked (SKIP LOCKED,
    so two reconcilers never take the same job) until the caller's transaction ends."""
    running = select(Batch.id).where(Batch.state == BatchState.RUNNING)
    rows = conn.execute(
        select(Job.id, Job.batch_id, Job.state, Job.stage_done, Job.node, Job.task_id)
        .where(Job.batch_id.in_(running), _OWED, Job.lease_until < before)
        .order_by(Job.lease_until)
        .limit(limit)
        .with_for_update(skip_locked=True)
    ).all()
    return [
        Owed(
            job_id=row.id,
            batch_id=row.batch_id,
            stage=NEXT_STAGE_OF[row.state] if row.stage_done else sql.STATE_STAGE[row.state],
            node=row.node,
            task_id=row.task_id,
        )
        for row in rows
    ]


def postpone(conn: Connection, job_ids: list[int], *, until: datetime) -> None:
    """Move the resend time of these owed jobs to ``until`` (those claimed meanwhile keep their lease)."""
    if job_ids:
        conn.execute(_POSTPONE, {"ids": job_ids, "until": until})
