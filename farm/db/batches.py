"""New batches as rows: the batch, one group per task and their jobs, found again by idempotency key.

What submitting writes (``farm.batches.submit`` drives it: validation, the key, the enqueue after
commit). A batch's jobs are owed their INIT from its commit on, so a crash before they are sent
loses nothing: the reconciler sends them at ``owed_until``.
"""

from __future__ import annotations

import hashlib
import json
from datetime import datetime

from sqlalchemy import insert, select
from sqlalchemy.orm import Session

from farm.constants import BatchState
from farm.db import dynamic
from farm.db.jobs.statements import GROUPS
from farm.db.models import Batch, Job
from farm.db.newjobs import insert_jobs
from farm.errors import Conflict
from farm.schemas import BatchCreate
from farm.schemas.trials import DEFAULT_HISTORY


def request_hash(request: BatchCreate) -> str:
    # The default history is left out, so a request hashes as it did before the field existed (an
    # idempotent resubmit across the upgrade is not a conflict).
    # So do limits and a quorum left unset.
    exclude = {"history"} if request.history == DEFAULT_HISTORY else set()
    exclude |= {name for name in ("limits", "quorum") if getattr(request, name) is None}
    body = json.dumps(request.model_dump(mode="json", exclude=exclude), sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(body.encode()).hexdigest()


def find_batch_by_key(session: Session, key: str, digest: str) -> Batch | None:
    """The batch an idempotency key already made; Conflict if the body was different."""
    batch = session.scalars(select(Batch).where(Batch.idempotency_key == key)).first()
    if batch is not None and batch.request_hash != digest:
        raise Conflict(f"idempotency key {key!r} was already used for a different batch (id {batch.id})")
    return batch


def create_batch(
    session: Session,
    request: BatchCreate,
    *,
    idempotency_key: str | None,
    digest: str,
    now: datetime,
    owed_until: datetime,
) -> tuple[Batch, list[int]]:
    """Insert the batch, one group per task and ``group_size`` jobs per group; returns the batch
    and its job ids in order. Each job is owed its INIT from this commit on: the reconciler sends
    it at ``owed_until`` if no worker has claimed it by then (the API crashed before sending).
    A dynamic batch's groups get their jobs only as they start (``farm.db.dynamic``)."""
    batch = Batch(
        idempotency_key=idempotency_key,
        request_hash=digest,
        state=BatchState.RUNNING,
        group_size=request.group_size,
        # What the trainer set, not the defaults: a harness job's trial overrides only those.
        sampling=request.sampling.model_dump(mode="json", exclude_unset=True),
        meta=request.metadata,
        max_staleness=request.max_staleness,
        on_stale=request.on_stale if request.max_staleness is not None else None,
        history=request.history,
        dynamic=None if request.dynamic is None else request.dynamic.model_dump(mode="json"),
        limits=None if request.limits is None else request.limits.model_dump(mode="json", exclude_none=True),
        quorum=None if request.quorum is None else request.quorum.model_dump(mode="json", exclude_none=True),
        # A dynamic batch counts its whole pool until it stops, so no job's finish completes it early.
        total_jobs=request.group_size * len(request.tasks),
        finished_jobs=0,
        created_at=now,
    )
    session.add(batch)
    session.flush()
    if request.dynamic is not None:
        return batch, _start_dynamic(session, batch, request, now=now, owed_until=owed_until)
    # Groups go in as one multi-row Core INSERT, as their jobs do.
    rows = [
        {"batch_id": batch.id, "index": i, "type": task.type, "config": task.config, "name": task.name}
        for i, task in enumerate(request.tasks)
    ]
    group_ids = session.scalars(insert(GROUPS).returning(GROUPS.c.id, sort_by_parameter_order=True), rows).all()
    groups = [(group_id, i, task.type) for i, (group_id, task) in enumerate(zip(group_ids, request.tasks, strict=True))]
    jobs = insert_jobs(
        session,
        batch_id=batch.id,
        groups=groups,
        group_size=request.group_size,
        seed=request.sampling.seed,
        now=now,
        owed_until=owed_until,
    )
    return batch, [job_id for job_id, _ in jobs]


def _start_dynamic(
    session: Session, batch: Batch, request: BatchCreate, *, now: datetime, owed_until: datetime
) -> list[int]:
    """A dynamic batch's pool of groups, and the first groups started; returns their job ids."""
    assert request.dynamic is not None
    dynamic.create_pool(session, batch, request.tasks)
    started = dynamic.start_groups(session, batch, dynamic.in_flight(request.dynamic), now=now, owed_until=owed_until)
    if started.groups == 0:
        batch.end_reason = "pool_exhausted"  # every prompt skipped by the ledger: nothing to run
        batch.state, batch.finished_at, batch.total_jobs = BatchState.COMPLETE, now, 0
    return [job_id for job_id, _ in started.jobs]


def job_ids_of(session: Session, batch_id: int) -> list[tuple[int, str | None]]:
    """The batch's jobs as (id, Celery task id), in order: what submitting sends INIT to."""
    return [
        (row.id, row.task_id)
        for row in session.execute(select(Job.id, Job.task_id).where(Job.batch_id == batch_id).order_by(Job.id))
    ]


def mark_enqueued(session: Session, batch_id: int, *, now: datetime) -> None:
    """Every job of the batch was sent its INIT: an idempotent resubmit need not send them again."""
    session.get_one(Batch, batch_id).enqueued_at = now
