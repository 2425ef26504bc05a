"""Sending stages by task name: what the API and the pipeline use (no stage code imported)."""

from __future__ import annotations

from collections.abc import Iterable

from celery import Celery

from farm.constants import TASK_FOR_STAGE, Stage, queue_name


def send_stage(
    app: Celery, *, job_id: int, stage: Stage, node: str | None, task_id: str | None, countdown: float | None = None
) -> None:
    app.send_task(
        TASK_FOR_STAGE[stage], args=[job_id], queue=queue_name(stage, node), task_id=task_id, countdown=countdown
    )


#: messages per Redis pipeline when a batch's INITs are sent.
PUBLISH_BATCH = 500


def send_init_many(app: Celery, jobs: Iterable[tuple[int, str | None]]) -> int:
    """Enqueue INIT for many jobs: one pooled producer, and kombu's publish batch, which sends
    ``PUBLISH_BATCH`` messages per Redis pipeline instead of one round trip (and one client
    object) per message. A failed flush raises; the batch then stays un-enqueued and a resubmit
    sends it again."""
    sent = 0
    with app.producer_or_acquire() as producer, producer.batch(max_size=PUBLISH_BATCH):
        for job_id, task_id in jobs:
            app.send_task(
                TASK_FOR_STAGE[Stage.INIT],
                args=[job_id],
                queue=queue_name(Stage.INIT),
                task_id=task_id,
                producer=producer,
            )
            sent += 1
    return sent


def revoke(app: Celery, task_ids: list[str]) -> None:
    if task_ids:
        app.control.revoke(task_ids)
