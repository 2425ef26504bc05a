"""The job state machine's writes besides claims (``farm.db.jobs.claims``) and completions
(``farm.db.jobs.completions``): renew leases, retry or fail a stage, cancel a batch, find lapsed
leases. Each function runs inside the caller's transaction.

The usual case of a claim or a completion is one conditional UPDATE that checks the job is
where the step expects it (a claim: the previous stage done; a completion: this worker's
attempt still running) and moves it. Everything else (a re-delivered message, a lapsed lease,
a cancel, the last attempt) takes the locking path: ``SELECT ... FOR UPDATE`` of the job row
(SQLite's BEGIN IMMEDIATE serialises writers instead), so a re-delivered or duplicated Celery
message can never run a stage twice at once. Lock order is always job rows first, then the
batch row, so two writers cannot deadlock.

An attempt's ``stage_runs`` row is written once, when the attempt ends (completed, retried,
failed, cancelled, or found lost); while it runs it lives on the job row (``worker``, ``node``,
``stage_attempts``, ``stage_started_at``). Statements take a Core ``Connection`` (the ORM
Session doubled the cost of a claim) and are built once (see ``farm.db.jobs.statements``).
"""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from datetime import datetime
from typing import Any

from sqlalchemy import Connection, func, select, update

from farm.constants import TERMINAL_STATES, BatchState, JobState, Outcome, Stage, StageStatus
from farm.db import teardowns
from farm.db.base import utcnow
from farm.db.jobs import attempts, jobrows
from farm.db.jobs import statements as sql
from farm.db.jobs.jobrows import LOST_ERROR, STAGE_STATE, STATE_STAGE, JobRow
from farm.db.models import Batch, Job, check_transition


def renew_leases(session: Connection, *, job_ids: list[int], worker: str, until: datetime) -> set[int]:
    """Extend the leases ``worker`` holds on these jobs; returns the ids it still owns (a job
    missing from the answer was cancelled, or taken over after this worker stalled)."""
    params = {"ids": job_ids, "_worker": worker, "_until": until}
    return set(session.execute(sql.RENEW_LEASES, params).scalars())


def retry_stage(
    session: Connection, *, job_id: int, stage: Stage, worker: str, now: datetime, error: str, resend_until: datetime
) -> str | None:
    """Give the stage back for another attempt; returns the new task id, or None if not owned.

    As with the sweeper, the lease passes to no one until ``resend_until``: if the delayed message
    never arrives, the sweeper sends it again."""
    job, _ = jobrows.owned_attempt(session, job_id, stage, worker)
    if job is None:
        return None
    attempts.record_unfinished(session, job, StageStatus.RETRY, now, error)
    task_id = uuid.uuid4().hex
    jobrows.set_values(session, job_id, lease_until=resend_until, worker=None, task_id=task_id, stage_started_at=None)
    return task_id


def fail_stage(
    session: Connection, *, job_id: int, stage: Stage, worker: str, now: datetime, outcome: Outcome, error: str
) -> bool:
    """The stage failed for good: the job ends ``failed`` with an infrastructure outcome."""
    job, _ = jobrows.owned_attempt(session, job_id, stage, worker)
    if job is None:
        return False
    attempts.record_unfinished(session, job, StageStatus.ERROR, now, error)
    jobrows.finish(session, job, JobState.FAILED, now=now, outcome=outcome, reason=error)
    return True


def cancel_batch(
    session: Connection,
    *,
    batch_id: int,
    now: datetime,
    teardown_due: datetime,
    reason: str = "batch cancelled",
    ends_as: BatchState = BatchState.CANCELLED,
) -> list[str]:
    """Cancel every unfinished job of a batch; returns the Celery task ids to revoke. Each job past
    INIT is owed a teardown on its node, sent again at ``teardown_due`` if not done by then.

    A dynamic batch that reached its target (or spent its pool) stops this way too, ``ends_as``
    complete: its total becomes the jobs it made (it counted the whole pool until then)."""
    jobs: Sequence[JobRow] = session.execute(
        select(*sql.JOB_COLUMNS)
        .where(Job.batch_id == batch_id, Job.state.not_in(list(TERMINAL_STATES)))
        .order_by(Job.id)
        .with_for_update()
    ).all()
    # Marked before the finish positions are taken, so the last one does not mark it complete.
    values: dict[str, Any] = {"state": ends_as, "finished_at": now}
    if ends_as is BatchState.COMPLETE:
        values["total_jobs"] = select(func.count()).where(Job.batch_id == batch_id).scalar_subquery()
    session.execute(update(Batch).where(Batch.id == batch_id, Batch.state == BatchState.RUNNING).values(values))
    if not jobs:
        return []
    first = jobrows.take_finish_seqs(session, batch_id, len(jobs), now)
    rows = []
    for offset, job in enumerate(jobs):
        check_transition(job.id, job.state, JobState.CANCELLED)
        # A running attempt ends here: its worker's result will be discarded.
        attempts.record_unfinished(session, job, StageStatus.CANCELLED, now, None)
        rows.append(
            {
                "_job_id": job.id,
                "state": JobState.CANCELLED,
                "outcome": Outcome.CANCELLED,
                "reason": reason,
                "finish_seq": first + offset,
                "finished_at": now,
                "lease_until": None,
                "stage_started_at": None,
            }
        )
    session.execute(sql.UPDATE_JOB, rows)
    teardowns.owe(
        session,
        [
            {"job_id": job.id, "node": job.node, "stage": teardowns.stage_for(job.state)}
            for job in jobs
            if job.node is not None and job.state is not JobState.QUEUED
        ],
        due_at=teardown_due,
    )
    # Only INIT messages are revoked: a job past INIT holds a sandbox on its node, and its next
    # message must still arrive there to tear it down (the claim sees the cancel).
    return [job.task_id for job in jobs if job.state is JobState.QUEUED and job.task_id]


def expired_leases(
    session: Connection, *, now: datetime, resend_until: datetime, limit: int = 500
) -> list[tuple[int, Stage, str | None, str]]:
    """Running stages whose lease lapsed before ``now``: (job id, stage, node, fresh task id) to re-send.

    The lease passes to no one (``worker`` NULL) until ``resend_until``, so two sweepers never both
    re-send, any worker may claim the re-sent message, and a message that is lost on its way (Redis
    down at the wrong moment) is simply re-sent again once that window lapses. The attempt that
    held the lease is recorded as lost: with no owner it can no longer complete.
    """
    # Only a running batch has unfinished jobs. Looking there, through the batch index, spares
    # the job table an index on the lease columns, which would cost every claim and completion.
    running = select(Batch.id).where(Batch.state == BatchState.RUNNING)
    jobs: Sequence[JobRow] = session.execute(
        select(*sql.JOB_COLUMNS)
        .where(
            Job.batch_id.in_(running),
            Job.state.in_(list(STAGE_STATE.values())),
            Job.stage_done.is_(False),
            Job.lease_until < now,
        )
        .order_by(Job.lease_until)
        .limit(limit)
        .with_for_update(skip_locked=True)
    ).all()
    out = []
    found_at = utcnow()
    for job in jobs:
        attempts.record_unfinished(session, job, StageStatus.LOST, found_at, LOST_ERROR)
        task_id = uuid.uuid4().hex
        jobrows.set_values(
            session, job.id, lease_until=resend_until, worker=None, task_id=task_id, stage_started_at=None
        )
        out.append((job.id, STATE_STAGE[job.state], job.node, task_id))
    return out
