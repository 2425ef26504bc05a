"""Teardowns the farm owes: sandboxes of jobs that ended (cancelled) while their stage message
was on its way or their stage still running.

The commit that cancels a job past INIT also writes its teardown: the node, and the stage
whose message reaches that node's queue (RUN for a job cancelled in INIT, else its own stage).
The worker that tears the sandbox down (the claim that finds the job ended, or the stage that
finds its result discarded) deletes the row; until then the reconciler sends that message to
the node again at ``due_at``. A lost node's teardowns are dropped with it.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any

from sqlalchemy import Connection, bindparam, delete, insert, select, update

from farm.constants import JobState, Stage
from farm.db.models import Teardown


@dataclass(frozen=True)
class Owed:
    job_id: int
    node: str
    stage: Stage


def stage_for(state: JobState) -> Stage:
    """The stage whose message goes to the node's queue for a job that was in ``state``."""
    return Stage.EVAL if state is JobState.EVAL else Stage.RUN


def owe(conn: Connection, rows: list[dict[str, Any]], *, due_at: datetime) -> None:
    """Record teardowns ({"job_id", "node", "stage"}) in the caller's transaction."""
    if rows:
        conn.execute(insert(Teardown), [{**row, "due_at": due_at} for row in rows])


def settle(conn: Connection, job_id: int) -> None:
    conn.execute(delete(Teardown).where(Teardown.job_id == job_id))


def due(conn: Connection, *, before: datetime, limit: int = 500) -> list[Owed]:
    """Teardowns due before ``before``, locked (SKIP LOCKED) until the caller's transaction ends."""
    rows = conn.execute(
        select(Teardown.job_id, Teardown.node, Teardown.stage)
        .where(Teardown.due_at < before)
        .order_by(Teardown.due_at)
        .limit(limit)
        .with_for_update(skip_locked=True)
    ).all()
    return [Owed(job_id=row.job_id, node=row.node, stage=row.stage) for row in rows]


_POSTPONE = (
    update(Teardown).where(Teardown.job_id.in_(bindparam("ids", expanding=True))).values(due_at=bindparam("until"))
)


def postpone(conn: Connection, job_ids: list[int], *, until: datetime) -> None:
    if job_ids:
        conn.execute(_POSTPONE, {"ids": job_ids, "until": until})


def drop_node(conn: Connection, node: str) -> None:
    """A lost node's sandboxes went with it."""
    conn.execute(delete(Teardown).where(Teardown.node == node))
