"""Claiming a stage of a job: the usual claim in one conditional UPDATE, everything else
(a re-delivered message, a lapsed lease, the last attempt, a stale message) under the row lock."""

from __future__ import annotations

import copy
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any, cast

from sqlalchemy import Connection, Row

from farm.constants import TERMINAL_STATES, JobState, Outcome, Stage, StageStatus
from farm.db.jobs import attempts, jobrows
from farm.db.jobs import statements as sql
from farm.db.jobs.jobrows import LOST_ERROR, PREVIOUS_STATE, STAGE_STATE, GrantedRow, TaskJobRow
from farm.db.sampling import BatchSettings, SamplingCache
from farm.schemas import SamplingParams, TrajectoryData
from farm.schemas.trials import DEFAULT_HISTORY, TrialHistory


@dataclass(frozen=True)
class Claim:
    """A stage this worker now owns. ``skip`` set means: do nothing, the message was stale."""

    job_id: int
    stage: Stage
    skip: str | None = None
    attempt: int = 0
    batch_id: int = 0
    type: str = ""
    config: dict[str, Any] | None = None
    state: dict[str, Any] | None = None
    sampling: SamplingParams | None = None
    #: the batch's history policy (``StageContext.history``).
    history: TrialHistory = DEFAULT_HISTORY
    seed: int | None = None
    node: str | None = None
    gave_up: bool = False
    #: RUN's episode, handed to EVAL.
    trajectory: TrajectoryData | None = None
    #: what the completion needs to write its result without reading the job again: when this
    #: attempt began, the job's stage data as claimed (never handed to the handler, which may
    #: change its ``state``), when the job was created, and RUN's outcome (for EVAL).
    started_at: datetime | None = None
    stage_data: dict[str, Any] = field(default_factory=dict)
    created_at: datetime | None = None
    outcome: Outcome | None = None
    reason: str | None = None
    #: the batch's limits as stored (None: the farm's), whether it has a quorum, and when the job's
    #: first INIT began (its wall budget runs from then).
    limits: dict[str, Any] | None = None
    has_quorum: bool = False
    init_at: datetime | None = None


def _handoff(job: TaskJobRow, stage: Stage, **extra: Any) -> Claim:
    """A skipped claim that still carries what a teardown on this node needs."""
    state = dict((job.stage_data or {}).get("state", {}))
    return Claim(
        job.id,
        stage,
        type=job.type,
        node=job.node,
        config=dict(job.config),
        state=state,
        batch_id=job.batch_id,
        **extra,
    )


def claim_stage(
    session: Connection,
    *,
    job_id: int,
    stage: Stage,
    node: str,
    worker: str,
    now: datetime,
    lease_s: float,
    max_attempts: int,
    samplings: SamplingCache | None = None,
) -> Claim:
    """Take ownership of ``stage`` of a job, or explain why this delivery is stale.

    ``samplings`` keeps the batches' sampling parameters this process has already read."""
    claim = claim_next(
        session, job_id=job_id, stage=stage, node=node, worker=worker, now=now, lease_s=lease_s, samplings=samplings
    )
    if claim is not None:
        jobrows.commit_early(session)
        return claim
    return _claim_locked(
        session,
        job_id=job_id,
        stage=stage,
        node=node,
        worker=worker,
        now=now,
        lease_s=lease_s,
        max_attempts=max_attempts,
    )


def claim_next(
    conn: Connection,
    *,
    job_id: int,
    stage: Stage,
    node: str,
    worker: str,
    now: datetime,
    lease_s: float,
    samplings: SamplingCache | None = None,
) -> Claim | None:
    """The usual claim in one statement: the previous stage is done, and the job moves into
    ``stage``. None when it is anything else (``claim_stage`` then sorts it out under the row
    lock). Needs no transaction of its own, so it may run on an autocommit connection."""
    params = {"_job_id": job_id, "_now": now, "_until": now + timedelta(seconds=lease_s), "_worker": worker}
    if stage is Stage.INIT:
        params["_node"] = node
    job = conn.execute(sql.CLAIM_NEXT[stage], params).one_or_none()
    if job is None:
        return None
    settings = _settings(conn, job.batch_id, samplings)
    trajectory = _returned_trajectory(job) if stage is Stage.EVAL else None
    return _granted(job, stage, attempt=1, now=now, node=job.node, settings=settings, trajectory=trajectory)


def _settings(session: Connection, batch_id: int, samplings: SamplingCache | None) -> BatchSettings:
    settings = samplings.get(batch_id) if samplings is not None else None
    if settings is None:
        row = session.execute(sql.SAMPLING_OF_BATCH, {"batch_id": batch_id}).one()
        settings = _batch_settings(row.sampling, row.history, row.limits, row.quorum)
        if samplings is not None:
            samplings.put(batch_id, settings)
    return settings


def _batch_settings(
    sampling: dict[str, Any], history: str, limits: dict[str, Any] | None, quorum: dict[str, Any] | None
) -> BatchSettings:
    params = SamplingParams.model_validate(sampling)
    return BatchSettings(params, cast(TrialHistory, history), limits, quorum is not None)


def _claim_locked(
    session: Connection,
    *,
    job_id: int,
    stage: Stage,
    node: str,
    worker: str,
    now: datetime,
    lease_s: float,
    max_attempts: int,
) -> Claim:
    """The unusual claims, under the job row lock: re-deliveries, lapsed leases, retries, the
    last attempt, stale messages."""
    job = jobrows.lock_with_task(session, job_id)
    if job is None:
        return Claim(job_id, stage, skip="no such job")
    if job.state in TERMINAL_STATES:
        return _handoff(job, stage, skip=f"job is already {job.state.value}")
    target = STAGE_STATE[stage]
    values: dict[str, Any]
    if job.state is PREVIOUS_STATE[stage] and job.stage_done:
        values = {**jobrows.move(job.id, job.state, target, now), "stage_attempts": 1}
    elif job.state is target and not job.stage_done:
        if job.worker is not None and job.lease_until is not None and job.lease_until > now:
            return Claim(job_id, stage, skip=f"{stage.value} is running on {job.worker} under a live lease")
        attempts.record_unfinished(session, job, StageStatus.LOST, now, LOST_ERROR)
        batch_attempts = (job.limits or {}).get("max_attempts")
        if job.stage_attempts >= (batch_attempts or max_attempts):
            if batch_attempts is None:
                reason, outcome = f"{stage.value} did not complete in {max_attempts} attempts", Outcome.INFRA_ERROR
            else:
                reason = f"{stage.value} did not complete within limits.max_attempts={batch_attempts}"
                outcome = Outcome.TIMEOUT
            jobrows.finish(session, job, JobState.FAILED, now=now, outcome=outcome, reason=reason)
            return _handoff(job, stage, skip="attempts exhausted", gave_up=True)
        values = {"stage_attempts": job.stage_attempts + 1}
    elif job.state is target:
        return Claim(job_id, stage, skip=f"{stage.value} already completed")
    else:
        return Claim(job_id, stage, skip=f"job is in {job.state.value}, not ready for {stage.value}")

    jobrows.set_values(
        session,
        job_id,
        **values,
        attempts=job.attempts + 1,
        stage_done=False,
        worker=worker,
        lease_until=now + timedelta(seconds=lease_s),
        stage_started_at=now,
        **({"node": node} if stage is Stage.INIT else {}),
    )
    settings = _batch_settings(job.sampling, job.history, job.limits, job.quorum)
    attempt = values["stage_attempts"]
    # INIT moves the job to this node; a later stage runs where its sandbox is.
    on = node if stage is Stage.INIT else job.node
    trajectory = attempts.load_trajectory(session, job.id) if stage is Stage.EVAL else None
    return _granted(job, stage, attempt=attempt, now=now, node=on, settings=settings, trajectory=trajectory)


def _granted(
    job: GrantedRow,
    stage: Stage,
    *,
    attempt: int,
    now: datetime,
    node: str | None,
    settings: BatchSettings,
    trajectory: TrajectoryData | None,
) -> Claim:
    """The claim handed to the stage, from the job row as it was claimed."""
    data = job.stage_data or {}
    return Claim(
        job_id=job.id,
        stage=stage,
        attempt=attempt,
        batch_id=job.batch_id,
        type=job.type,
        config=dict(job.config),
        # The handler gets its own copy: what it does to it must not leak into the stored data.
        state=copy.deepcopy(data.get("state", {})),
        sampling=settings.sampling,
        history=settings.history,
        seed=job.seed,
        node=node,
        trajectory=trajectory,
        started_at=now,
        stage_data=data,
        created_at=job.created_at,
        outcome=job.outcome,
        reason=job.reason,
        limits=settings.limits,
        has_quorum=settings.has_quorum,
        init_at=job.init_at,
    )


def _returned_trajectory(row: Row[Any]) -> TrajectoryData | None:
    """RUN's episode, as EVAL's usual claim read it in its own statement (None: RUN left none)."""
    return attempts.unpack_trajectory(row) if row.token_ids is not None else None
