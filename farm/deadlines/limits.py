"""The limits a job keeps: the batch's (``BatchLimits``) where it set them, else the farm's.

Three places enforce them, so a handler that ignores its deadline cannot hold a batch: the stage's
coroutine is cancelled ``limit_grace_s`` past its limit (``farm.worker.pipeline``); the lease renewer
stops renewing a stage past its deadline; and the sweeper ends any job whose stage or wall budget ran
out while its worker was hung or gone (``end_overdue``), owing its sandbox's teardown in that commit.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from sqlalchemy import Connection, and_, or_, select

from farm.config import WorkerSettings
from farm.constants import BatchState, JobState, Outcome, Stage, StageStatus
from farm.db import teardowns
from farm.db.jobs import attempts, jobrows
from farm.db.jobs import statements as sql
from farm.db.jobs.jobrows import STAGE_STATE, STATE_STAGE, JobRow
from farm.db.models import Batch, Job

_STAGE_FIELD = {Stage.INIT: "init_s", Stage.RUN: "run_s", Stage.EVAL: "eval_s"}


@dataclass(frozen=True)
class Limits:
    """A job's limits in seconds (and attempts per stage), with which of them its batch set."""

    init_s: float
    run_s: float
    eval_s: float
    job_wall_s: float
    max_attempts: int
    grace_s: float
    by_batch: frozenset[str]

    def stage_s(self, stage: Stage) -> float:
        return float(getattr(self, _STAGE_FIELD[stage]))

    def named(self, field: str) -> str:
        """``limits.run_s=60`` (the batch's) or ``worker.run_timeout_s=3600`` (the farm's)."""
        value = getattr(self, field)
        if field in self.by_batch:
            return f"limits.{field}={value:g}"
        setting = {"init_s": "init_timeout_s", "run_s": "run_timeout_s", "eval_s": "eval_timeout_s"}.get(field, field)
        return f"worker.{setting}={value:g}"

    def allowance(self, stage: Stage, *, init_at: datetime | None, now: datetime) -> tuple[float, str]:
        """How long ``stage`` may run from ``now``, and the limit that says so (its own, or what
        is left of the job's wall budget, whichever is less)."""
        stage_s, field = self.stage_s(stage), _STAGE_FIELD[stage]
        if init_at is not None:
            wall_left = self.job_wall_s - (now - init_at).total_seconds()
            if wall_left < stage_s:
                return wall_left, "job_wall_s"
        return stage_s, field

    def reason(self, stage: Stage, field: str) -> str:
        if field == "job_wall_s":
            return f"the job ran past its wall budget {self.named(field)}s in {stage.value}"
        return f"{stage.value} ran past its limit {self.named(field)}s"


def resolve(worker: WorkerSettings, stored: dict[str, Any] | None) -> Limits:
    """The limits of a batch that stored ``stored`` (its ``BatchLimits`` without unset fields)."""
    given = {key: value for key, value in (stored or {}).items() if value is not None}
    return Limits(
        init_s=float(given.get("init_s", worker.init_timeout_s)),
        run_s=float(given.get("run_s", worker.run_timeout_s)),
        eval_s=float(given.get("eval_s", worker.eval_timeout_s)),
        job_wall_s=float(given.get("job_wall_s", worker.job_wall_s)),
        max_attempts=int(given.get("max_attempts", worker.max_attempts)),
        grace_s=worker.limit_grace_s,
        by_batch=frozenset(given),
    )


@dataclass(frozen=True)
class Ended:
    """A job the sweeper ended for a limit."""

    job_id: int
    batch_id: int
    reason: str


def backstop_s(worker: WorkerSettings) -> float:
    """How long past a limit the sweeper ends a job: after the stage's own worker had its turn (it
    stops the stage ``limit_grace_s`` past the limit) and one lease renewal more, so a worker that is
    alive ends its own stage and the sweeper ends only those of hung or lost workers."""
    return 2 * worker.limit_grace_s + worker.lease_s / 3


def end_overdue(conn: Connection, worker: WorkerSettings, *, now: datetime, teardown_due: datetime) -> list[Ended]:
    """End (outcome ``timeout``) every job of a running batch whose stage ran ``backstop_s`` past its
    limit, or its wall budget, however its worker fares; each one past INIT is owed its teardown on
    its node in the same commit. Rows are locked SKIP LOCKED: a completion in progress wins, and the
    job is looked at again next sweep."""
    ended: list[Ended] = []
    for batch_id, stored in conn.execute(select(Batch.id, Batch.limits).where(Batch.state == BatchState.RUNNING)):
        limits = resolve(worker, stored)
        grace = timedelta(seconds=backstop_s(worker))
        shortest = timedelta(seconds=min(limits.init_s, limits.run_s, limits.eval_s)) + grace
        overdue = or_(
            and_(Job.stage_done.is_(False), Job.stage_started_at < now - shortest),
            Job.init_at < now - timedelta(seconds=limits.job_wall_s) - grace,
        )
        jobs: Sequence[JobRow] = conn.execute(
            select(*sql.JOB_COLUMNS)
            .where(Job.batch_id == batch_id, Job.state.in_(list(STAGE_STATE.values())), overdue)
            .with_for_update(skip_locked=True)
        ).all()
        for job in jobs:
            reason = _overdue_reason(limits, job, now, backstop_s(worker))
            if reason is None:
                continue
            if not job.stage_done:
                attempts.record_unfinished(conn, job, StageStatus.ERROR, now, reason)
            jobrows.finish(conn, job, JobState.FAILED, now=now, outcome=Outcome.TIMEOUT, reason=reason)
            if job.node is not None:
                owed = {"job_id": job.id, "node": job.node, "stage": teardowns.stage_for(job.state)}
                teardowns.owe(conn, [owed], due_at=teardown_due)
            ended.append(Ended(job.id, batch_id, reason))
    return ended


def _overdue_reason(limits: Limits, job: JobRow, now: datetime, grace: float) -> str | None:
    stage = STATE_STAGE[job.state]
    if not job.stage_done and job.stage_started_at is not None:
        ran = (now - job.stage_started_at).total_seconds()
        allowed, field = limits.allowance(stage, init_at=job.init_at, now=job.stage_started_at)
        if ran > allowed + grace:
            return limits.reason(stage, field) + " (ended by the farm)"
    if job.init_at is not None and (now - job.init_at).total_seconds() > limits.job_wall_s + grace:
        return limits.reason(stage, "job_wall_s") + " (ended by the farm)"
    return None
