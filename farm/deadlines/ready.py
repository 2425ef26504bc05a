"""When a batch with a quorum is ready for its trainer, and what becomes of the rest.

One transaction makes a batch ready: it records when, why (``quorum`` or ``deadline``) and its
``ready_seq`` (finish positions 1..ready_seq are the trainer's step), and, for ``rest: cancel``, ends
every job still going (outcome ``cancelled``, the reason saying it was cut, teardowns owed) in that
same commit. For ``rest: carry`` nothing else is written: a carried job is a job of the batch past
``ready_seq`` in its finish order, so it is served once, by the results cursor, when it ends.

A worker settles the batch after each job of it ends; the sweeper settles every running batch with
a quorum each sweep (a deadline passes without any job ending; a crash may come between a job's
finish and its settle). Settling twice is harmless: the UPDATE that makes a batch ready only
matches a batch not ready yet.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta

from sqlalchemy import Connection, select, update

from farm.constants import TERMINAL_STATES, BatchState
from farm.db.jobs.lifecycle import cancel_batch
from farm.db.models import Batch, Job
from farm.schemas import Quorum

#: a batch in these states may become ready (a cancelled one never does).
_SETTLED_STATES = (BatchState.RUNNING, BatchState.COMPLETE)


@dataclass(frozen=True)
class Settled:
    """A batch made ready: why, its step's last finish position, and the INIT messages to revoke."""

    batch_id: int
    reason: str
    ready_seq: int
    rest: str
    revoke: list[str]


def settle(conn: Connection, batch_id: int, *, now: datetime, teardown_due: datetime) -> Settled | None:
    """Make the batch ready if its quorum is met or its deadline passed (see the module docstring)."""
    row = conn.execute(
        select(
            Batch.quorum, Batch.ready_at, Batch.finished_jobs, Batch.total_jobs, Batch.created_at, Batch.state
        ).where(Batch.id == batch_id)
    ).one_or_none()
    # A batch that completed before anyone settled it (its last jobs finished together) is ready too.
    if row is None or row.quorum is None or row.ready_at is not None or row.state not in _SETTLED_STATES:
        return None
    quorum = Quorum.model_validate(row.quorum)
    need = quorum.needed(row.total_jobs)
    if row.finished_jobs >= need:
        reason = "quorum"
    elif quorum.deadline_s is not None and now >= row.created_at + timedelta(seconds=quorum.deadline_s):
        reason = "deadline"
    else:
        return None
    cut = quorum.rest == "cancel" and row.state is BatchState.RUNNING
    if cut:
        # Job rows before the batch row, as every writer takes them: no deadlock with a completion.
        conn.execute(
            select(Job.id)
            .where(Job.batch_id == batch_id, Job.state.not_in(list(TERMINAL_STATES)))
            .order_by(Job.id)
            .with_for_update()
        ).all()
    ready_seq = conn.execute(
        update(Batch)
        .where(Batch.id == batch_id, Batch.ready_at.is_(None), Batch.state.in_(_SETTLED_STATES))
        .values(ready_at=now, ready_reason=reason, ready_seq=Batch.finished_jobs)
        .returning(Batch.ready_seq)
    ).scalar_one_or_none()
    if ready_seq is None:
        return None  # another settle made it ready first
    revoke: list[str] = []
    if cut:
        why = (
            f"cut: the batch was ready at its quorum ({need} of {row.total_jobs} jobs finished)"
            if reason == "quorum"
            else f"cut: the batch was ready at its deadline (deadline_s={quorum.deadline_s:g})"
        )
        revoke = cancel_batch(
            conn, batch_id=batch_id, now=now, teardown_due=teardown_due, reason=why, ends_as=BatchState.COMPLETE
        )
    return Settled(batch_id, reason, int(ready_seq), quorum.rest, revoke)


def unready(conn: Connection) -> list[int]:
    """Running batches with a quorum that are not ready yet: what the sweeper settles."""
    return list(
        conn.scalars(
            select(Batch.id).where(
                Batch.state.in_(_SETTLED_STATES), Batch.quorum.is_not(None), Batch.ready_at.is_(None)
            )
        )
    )
