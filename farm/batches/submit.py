"""Submitting a batch: check it, write it once per idempotency key, then send every job its INIT.

The order is the point. Every task's config is checked by its handler's config class first, so a
bad spec is a 422, not a failed job. The batch is committed before any message is sent (a worker
must find the rows a message names), and it is marked sent only after the send: a resubmit with the
same key after a crash between the two sends again, rather than leave the jobs waiting for the
reconciler to send them at ``owed_until``. Duplicates are harmless: a stage is claimed once.
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import timedelta

from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session, sessionmaker

from farm.config import Settings
from farm.db import batches
from farm.db.base import utcnow
from farm.db.session import transaction
from farm.dynamic.filters import SPREAD_FILTERS, get_filter
from farm.errors import ConfigError, HandlerNotFound, InvalidSpec
from farm.handlers.base import validate_config
from farm.handlers.registry import get_config_class
from farm.schemas import BatchCreate, BatchCreated

#: sends INIT to each (job id, Celery task id): ``farm.worker.enqueue.send_init_many`` bound to an app.
Send = Callable[[list[tuple[int, str | None]]], object]


def submit_batch(
    sessions: sessionmaker[Session], settings: Settings, request: BatchCreate, *, key: str | None, send: Send
) -> BatchCreated:
    """Create the batch (or find the one ``key`` made) and send its jobs their INIT if that was not
    done yet. ``created`` is false for an idempotent resubmit.

    Raises:
        InvalidSpec: the batch is over a limit, or a task's config or the dynamic options are wrong.
        HandlerNotFound: a task names no installed handler.
        Conflict: ``key`` was used before for a different body.
    """
    validate(request, settings)
    digest = batches.request_hash(request)
    created = False
    try:
        with transaction(sessions) as session:
            batch = batches.find_batch_by_key(session, key, digest) if key else None
            if batch is None:
                now = utcnow()
                owed_until = now + timedelta(seconds=settings.worker.lease_s)
                batch, _ = batches.create_batch(
                    session, request, idempotency_key=key, digest=digest, now=now, owed_until=owed_until
                )
                created = True
            batch_id, enqueued = batch.id, batch.enqueued_at is not None
    except IntegrityError:
        # Another request with the same idempotency key committed first: answer with its batch.
        with transaction(sessions) as session:
            found = batches.find_batch_by_key(session, key or "", digest)
            assert found is not None
            batch_id, enqueued = found.id, found.enqueued_at is not None
    with transaction(sessions) as session:
        jobs = batches.job_ids_of(session, batch_id)
    if not enqueued:
        send(jobs)
        with transaction(sessions) as session:
            batches.mark_enqueued(session, batch_id, now=utcnow())
    return BatchCreated(id=batch_id, job_ids=[job_id for job_id, _ in jobs], created=created)


def validate(request: BatchCreate, settings: Settings) -> None:
    """What the schema cannot say about a batch: the farm's limits, each task's config (by its
    handler's config class), a dynamic batch's options. Each a 422 naming the field.

    Raises:
        InvalidSpec: the first thing wrong, with the field it is about.
        HandlerNotFound: a task names no installed handler.
    """
    limits = settings.api
    if len(request.tasks) > limits.max_tasks_per_batch:
        raise InvalidSpec(
            f"tasks: {len(request.tasks)} tasks exceed the limit of {limits.max_tasks_per_batch} "
            "per batch; submit several batches",
            field="tasks",
        )
    job_count = len(request.tasks) * request.group_size
    if request.dynamic is None and job_count > limits.max_jobs_per_batch:
        raise InvalidSpec(
            f"group_size: {len(request.tasks)} tasks x group_size {request.group_size} = {job_count} jobs exceed the "
            f"limit of {limits.max_jobs_per_batch} per batch; submit several batches",
            field="group_size",
        )
    _validate_tasks(request)
    _validate_dynamic(request)


def _validate_tasks(request: BatchCreate) -> None:
    """Only the config class is loaded (see ``farm.handlers.registry``): never the handler."""
    for i, task in enumerate(request.tasks):
        try:
            validate_config(get_config_class(task.type), task.config)
        except HandlerNotFound as exc:
            raise HandlerNotFound(f"tasks.{i}.type: {exc.message}", field=f"tasks.{i}.type") from exc
        except ConfigError as exc:
            # A `module:Class` type that cannot be imported or is no handler: the request's fault.
            raise InvalidSpec(f"tasks.{i}.type: {exc.message}", field=f"tasks.{i}.type") from exc
        except InvalidSpec as exc:
            raise InvalidSpec(f"tasks.{i}.{exc.message}", field=f"tasks.{i}.{exc.field}") from exc


def _validate_dynamic(request: BatchCreate) -> None:
    options = request.dynamic
    if options is None:
        return
    get_filter(options.filter)  # an unknown name is a 422 naming dynamic.filter
    if options.target_groups > len(request.tasks):
        raise InvalidSpec(
            f"dynamic.target_groups: {options.target_groups} informative groups cannot come from a pool of "
            f"{len(request.tasks)} tasks; give more tasks or ask for fewer groups",
            field="dynamic.target_groups",
        )
    if request.group_size < 2 and options.filter in SPREAD_FILTERS:
        raise InvalidSpec(
            f"group_size: the {options.filter!r} filter compares the rewards of a group's samples, so a group "
            "needs at least 2 (group_size 1 would never be informative)",
            field="group_size",
        )
