"""Submitting a batch: check it, write it once per idempotency key, then send every job its INIT.

The order is the point. Every task's config is checked by its handler's config class first, so a
bad spec is a 422, not a failed job. The batch is committed before any message is sent (a worker
must find the rows a message names), and it is marked sent only after the send: a resubmit with the
same key after a crash between the two sends again, rather than leave the jobs waiting for the
reconciler to send them at ``owed_until``. Duplicates are harmless: a stage is claimed once.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from datetime import timedelta
from typing import NoReturn

from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session, sessionmaker

from farm.config import Settings
from farm.db import batches
from farm.db.base import utcnow
from farm.db.session import transaction
from farm.dynamic.filters import SPREAD_FILTERS, get_filter
from farm.errors import ConfigError, HandlerNotFound, InvalidSpec, Problem
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
    handler's config class), a dynamic batch's options. One 422 that lists every problem found
    (``errors``, each ``{field, detail}``) and names the first in its message and ``field``.

    Raises:
        InvalidSpec: something is wrong (the first problem, and all of them in ``errors``).
        HandlerNotFound: the first problem is a task that names no installed handler.
    """
    found: list[tuple[type[InvalidSpec] | type[HandlerNotFound], Problem]] = []
    limits = settings.api
    if len(request.tasks) > limits.max_tasks_per_batch:
        detail = (
            f"{len(request.tasks)} tasks exceed the limit of {limits.max_tasks_per_batch} per batch; "
            "submit several batches"
        )
        found.append((InvalidSpec, {"field": "tasks", "detail": detail}))
    job_count = len(request.tasks) * request.group_size
    if request.dynamic is None and job_count > limits.max_jobs_per_batch:
        detail = (
            f"{len(request.tasks)} tasks x group_size {request.group_size} = {job_count} jobs exceed the "
            f"limit of {limits.max_jobs_per_batch} per batch; submit several batches"
        )
        found.append((InvalidSpec, {"field": "group_size", "detail": detail}))
    found += _task_problems([(task.type, task.config) for task in request.tasks])
    found += [(InvalidSpec, problem) for problem in _dynamic_problems(request)]
    found += [(InvalidSpec, problem) for problem in _quorum_problems(request, job_count)]
    if found:
        raise_problems(found)


def raise_problems(found: Sequence[tuple[type[InvalidSpec] | type[HandlerNotFound], Problem]]) -> NoReturn:
    """One error for every problem found: the first one's class, field and message."""
    cls, first = found[0]
    problems = [problem for _, problem in found]
    more = f" (and {len(problems) - 1} more)" if len(problems) > 1 else ""
    raise cls(f"{first['field']}: {first['detail']}{more}", field=first["field"], errors=problems)


def task_problems(tasks: Sequence[object]) -> list[Problem]:
    """The handler-level problems of tasks as they arrived (JSON), for a request refused before its
    tasks were read (another field is wrong): the tasks whose ``type`` and ``config`` are readable."""
    readable = [
        (task.get("type"), task.get("config", {})) if isinstance(task, dict) else (None, None) for task in tasks
    ]
    return [problem for _, problem in _task_problems(readable)]


def _task_problems(
    tasks: Sequence[tuple[object, object]],
) -> list[tuple[type[InvalidSpec] | type[HandlerNotFound], Problem]]:
    """Only the config class is loaded (see ``farm.handlers.registry``): never the handler. A task
    whose type or config is not even a string or an object is skipped (the schema says so)."""
    found: list[tuple[type[InvalidSpec] | type[HandlerNotFound], Problem]] = []
    for i, (task_type, config) in enumerate(tasks):
        if not isinstance(task_type, str) or not isinstance(config, dict):
            continue
        try:
            validate_config(get_config_class(task_type), config)
        except HandlerNotFound as exc:
            found.append((HandlerNotFound, {"field": f"tasks.{i}.type", "detail": exc.message}))
        except ConfigError as exc:
            # A `module:Class` type that cannot be imported or is no handler: the request's fault.
            found.append((InvalidSpec, {"field": f"tasks.{i}.type", "detail": exc.message}))
        except InvalidSpec as exc:
            problems = exc.errors or [{"field": exc.field or "config", "detail": exc.message}]
            found += [(InvalidSpec, {"field": f"tasks.{i}.{p['field']}", "detail": p["detail"]}) for p in problems]
    return found


def _dynamic_problems(request: BatchCreate) -> list[Problem]:
    options = request.dynamic
    if options is None:
        return []
    found: list[Problem] = []
    try:
        get_filter(options.filter)
    except InvalidSpec as exc:
        found.append({"field": exc.field or "dynamic.filter", "detail": _without_field(exc.message, exc.field)})
    if options.target_groups > len(request.tasks):
        detail = (
            f"{options.target_groups} informative groups cannot come from a pool of {len(request.tasks)} tasks; "
            "give more tasks or ask for fewer groups"
        )
        found.append({"field": "dynamic.target_groups", "detail": detail})
    if request.group_size < 2 and options.filter in SPREAD_FILTERS:
        detail = (
            f"the {options.filter!r} filter compares the rewards of a group's samples, so a group needs at least "
            "2 (group_size 1 would never be informative)"
        )
        found.append({"field": "group_size", "detail": detail})
    return found


def _quorum_problems(request: BatchCreate, job_count: int) -> list[Problem]:
    quorum = request.quorum
    if quorum is None:
        return []
    found: list[Problem] = []
    if request.dynamic is not None:
        detail = "a dynamic batch ends at its target_groups; a quorum applies only to a batch without `dynamic`"
        found.append({"field": "quorum", "detail": detail})
    elif quorum.min_jobs is not None and quorum.min_jobs > job_count:
        detail = (
            f"min_jobs {quorum.min_jobs} is more than the batch's {job_count} jobs "
            f"({len(request.tasks)} tasks x group_size {request.group_size}); ask for at most {job_count}"
        )
        found.append({"field": "quorum.min_jobs", "detail": detail})
    return found


def _without_field(message: str, field: str | None) -> str:
    """A message that starts ``field: `` (the one-problem form) without that start."""
    return message.removeprefix(f"{field}: ") if field else message
