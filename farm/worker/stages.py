"""The three Celery tasks: thin wrappers that hand a job id to the pipeline."""

from __future__ import annotations

import logging
import os
from typing import Any

from celery import Task
from redis.exceptions import RedisError
from sqlalchemy.exc import DBAPIError
from sqlalchemy.exc import TimeoutError as PoolTimeout

from farm.constants import TASK_FOR_STAGE, Stage
from farm.errors import ClaimLost
from farm.worker.app import FarmCelery
from farm.worker.pipeline import StageReport, execute_stage

log = logging.getLogger(__name__)

#: backoff while the database or Redis is unreachable past what the pipeline waits out (or the
#: database lost the stage's claim): the message waits, it is never dropped.
INFRA_RETRY_MAX_S = 30.0


def worker_id(task: Task) -> str:
    # The pid tells a restarted worker apart from the dead one that had the same hostname.
    return f"{task.request.hostname or 'local'}:{os.getpid()}"


def register_stages(app: FarmCelery) -> dict[Stage, Any]:
    """Register ``farm.stage.init|run|eval`` on ``app``; returns the task objects."""
    tasks: dict[Stage, Any] = {}
    for stage in Stage:

        def body(self: Task, job_id: int, _stage: Stage = stage) -> dict[str, Any]:
            try:
                report: StageReport = execute_stage(app.farm, app, _stage, int(job_id), worker=worker_id(self))
            except (DBAPIError, PoolTimeout, RedisError, ClaimLost) as exc:
                delay = min(2.0**self.request.retries, INFRA_RETRY_MAX_S)
                log.warning("job %s %s: infrastructure failed (%s); retry in %.0fs", job_id, _stage.value, exc, delay)
                raise self.retry(exc=exc, countdown=delay, max_retries=None) from exc
            # What Flower shows as the task's result: which job, of what type, and what happened.
            return {
                "job_id": report.job_id,
                "type": report.task_type,
                "stage": report.stage.value,
                "action": report.action,
                "detail": report.detail,
            }

        tasks[stage] = app.task(name=TASK_FOR_STAGE[stage], bind=True)(body)
    return tasks
