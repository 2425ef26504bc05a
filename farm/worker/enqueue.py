"""Sending stages by task name: what the API and the pipeline use (no stage code imported).

Messages are sent with an empty ``declare``: Celery would otherwise declare the queue before every
message (a kombu ``ensure`` wrapper and an entity copy each time, a tenth of a send's CPU).
On Redis a message to the default direct exchange goes to the list named by its queue
whether or not anyone declared it, and workers declare the queues they consume. The argument
reprs Celery puts in each message's headers are given too: its safe repr of ``[job_id]`` walks
the list with a generator per element.
"""

from __future__ import annotations

from collections.abc import Iterable

from celery import Celery

from farm.constants import TASK_FOR_STAGE, Stage, queue_name

NO_DECLARE = ()


def send_stage(
    app: Celery, *, job_id: int, stage: Stage, node: str | None, task_id: str | None, countdown: float | None = None
) -> None:
    app.send_task(
        TASK_FOR_STAGE[stage],
        args=[job_id],
        queue=queue_name(stage, node),
        task_id=task_id,
        countdown=countdown,
        declare=NO_DECLARE,
        argsrepr=f"[{job_id}]",
        kwargsrepr="{}",
    )


#: messages per Redis pipeline when a batch's INITs are sent.
PUBLISH_BATCH = 500


def send_init_many(app: Celery, jobs: Iterable[tuple[int, str | None]]) -> int:
    """Enqueue INIT for many jobs (see ``send_many``). A failed flush raises; the jobs stay owed
    and the reconciler sends them again."""
    return send_many(app, ((job_id, Stage.INIT, None, task_id) for job_id, task_id in jobs))


def send_many(app: Celery, messages: Iterable[tuple[int, Stage, str | None, str | None]]) -> int:
    """Send many stage messages (job id, stage, node, task id): one pooled producer, and kombu's
    publish batch, which sends ``PUBLISH_BATCH`` messages per Redis pipeline instead of one round
    trip (and one client object) per message."""
    sent = 0
    with app.producer_or_acquire() as producer, producer.batch(max_size=PUBLISH_BATCH):
        for job_id, stage, node, task_id in messages:
            app.send_task(
                TASK_FOR_STAGE[stage],
                args=[job_id],
                queue=queue_name(stage, node),
                task_id=task_id,
                producer=producer,
                declare=NO_DECLARE,
                argsrepr=f"[{job_id}]",
                kwargsrepr="{}",
            )
            sent += 1
    return sent


def revoke(app: Celery, task_ids: list[str]) -> None:
    if task_ids:
        app.control.revoke(task_ids)
