"""The job state machine's writes: claim a stage, renew its lease, complete it, finish or
cancel jobs. Each function runs inside the caller's transaction.

These are the hot path of every stage. The usual case of a claim or a completion is one
conditional UPDATE that checks the job is where the step expects it (a claim: the previous
stage done; a completion: this worker's attempt still running) and moves it. Everything else
(a re-delivered message, a lapsed lease, a cancel, the last attempt) falls back to the locking
path: ``SELECT ... FOR UPDATE`` of the job row (SQLite's BEGIN IMMEDIATE serialises writers
instead), so a re-delivered or duplicated Celery message can never run a stage twice at once.
Lock order is always job rows first, then the batch row, so two writers cannot deadlock.

An attempt's ``stage_runs`` row is written once, when the attempt ends (completed, retried,
failed, cancelled, or found lost); while it runs it lives on the job row (``worker``, ``node``,
``stage_attempts``, ``stage_started_at``). Statements take a Core ``Connection`` (the ORM
Session doubled the cost of a claim) and are built once (see ``farm.db.statements``).
"""

from __future__ import annotations

import copy
import uuid
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

from sqlalchemy import Connection, select, update

from farm.constants import POLICY_OUTCOMES, TERMINAL_STATES, BatchState, JobState, Outcome, Stage, StageStatus
from farm.db import attempts
from farm.db import statements as sql
from farm.db.base import utcnow
from farm.db.models import STATE_TIMESTAMP, Batch, Job, check_transition
from farm.db.sampling import SamplingCache
from farm.errors import ClaimLost
from farm.schemas import EvalResult, RunResult, SamplingParams, TrajectoryData

STAGE_STATE = sql.STAGE_STATE
STATE_STAGE = sql.STATE_STAGE
PREVIOUS_STATE = sql.PREVIOUS_STATE
NEXT_STAGE = {Stage.INIT: Stage.RUN, Stage.RUN: Stage.EVAL}
#: the error of an attempt whose lease lapsed.
LOST_ERROR = "the worker stopped renewing its lease (killed or hung)"


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


@dataclass(frozen=True)
class Completion:
    """What happened when a stage tried to record its result."""

    recorded: bool
    next_stage: Stage | None = None
    next_task_id: str | None = None
    node: str | None = None
    finished: JobState | None = None
    reason: str | None = None


#: a row of the job columns the statements select; Row's variadic generics add nothing over
#: attribute access here.
JobRow = Any


def _lock(session: Connection, job_id: int, *, with_task: bool = False) -> JobRow | None:
    """The job row, locked; with its group's config and batch's sampling when ``with_task``."""
    statement = sql.LOCK_JOB_WITH_TASK if with_task else sql.LOCK_JOB
    return session.execute(statement, {"job_id": job_id}).one_or_none()


def _set_job(session: Connection, job_id: int, **values: Any) -> None:
    session.execute(sql.UPDATE_JOB, {"_job_id": job_id, **values})


def _move(job_id: int, current: JobState, to: JobState, now: datetime) -> dict[str, Any]:
    """Column values for a legal move of a job to ``to`` (raises InvalidTransition otherwise)."""
    check_transition(job_id, current, to)
    values: dict[str, Any] = {"state": to}
    if column := STATE_TIMESTAMP.get(to):
        values[column] = now
    if to in TERMINAL_STATES:
        values.update(finished_at=now, lease_until=None, stage_started_at=None)
    return values


def _handoff(job: JobRow, stage: Stage, **extra: Any) -> Claim:
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
        _commit_early(session)
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
    sampling = _sampling(conn, job.batch_id, samplings)
    return _granted(conn, job, stage, attempt=1, now=now, node=job.node, config=job.config, sampling=sampling)


def _commit_early(session: Connection) -> None:
    """Let this transaction's commit return before PostgreSQL has its WAL on disk (~2 ms less
    per commit), as ``claim_next`` and ``complete_next`` on an autocommit engine without flush
    waits do. Only for writes a database crash may lose without harm, because something notices
    and redoes them: a lost claim is found by the stage's own completion (ClaimLost, the message
    is delivered again), a lost INIT or RUN completion by the lease sweeper. Every commit that
    finishes a job still waits, and it carries any earlier write with it (the WAL is written in
    order)."""
    if session.dialect.name == "postgresql":
        session.exec_driver_sql("SET LOCAL synchronous_commit TO OFF")


def _sampling(session: Connection, batch_id: int, samplings: SamplingCache | None) -> SamplingParams:
    sampling = samplings.get(batch_id) if samplings is not None else None
    if sampling is None:
        sampling = SamplingParams.model_validate(
            session.execute(sql.SAMPLING_OF_BATCH, {"batch_id": batch_id}).scalar_one()
        )
        if samplings is not None:
            samplings.put(batch_id, sampling)
    return sampling


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
    job = _lock(session, job_id, with_task=True)
    if job is None:
        return Claim(job_id, stage, skip="no such job")
    if job.state in TERMINAL_STATES:
        return _handoff(job, stage, skip=f"job is already {job.state.value}")
    target = STAGE_STATE[stage]
    values: dict[str, Any]
    if job.state is PREVIOUS_STATE[stage] and job.stage_done:
        values = {**_move(job.id, job.state, target, now), "stage_attempts": 1}
    elif job.state is target and not job.stage_done:
        if job.worker is not None and job.lease_until is not None and job.lease_until > now:
            return Claim(job_id, stage, skip=f"{stage.value} is running on {job.worker} under a live lease")
        attempts.record_unfinished(session, job, StageStatus.LOST, now, LOST_ERROR)
        if job.stage_attempts >= max_attempts:
            reason = f"{stage.value} did not complete in {max_attempts} attempts"
            _finish(session, job, JobState.FAILED, now=now, outcome=Outcome.INFRA_ERROR, reason=reason)
            return _handoff(job, stage, skip="attempts exhausted", gave_up=True)
        values = {"stage_attempts": job.stage_attempts + 1}
    elif job.state is target:
        return Claim(job_id, stage, skip=f"{stage.value} already completed")
    else:
        return Claim(job_id, stage, skip=f"job is in {job.state.value}, not ready for {stage.value}")

    _set_job(
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
    sampling = SamplingParams.model_validate(job.sampling)
    attempt = values["stage_attempts"]
    node = node if stage is Stage.INIT else job.node
    return _granted(session, job, stage, attempt=attempt, now=now, node=node, config=job.config, sampling=sampling)


def _granted(
    session: Connection,
    job: JobRow,
    stage: Stage,
    *,
    attempt: int,
    now: datetime,
    node: str | None,
    config: dict[str, Any],
    sampling: SamplingParams,
) -> Claim:
    """The claim handed to the stage, from the job row as it was claimed."""
    data = job.stage_data or {}
    return Claim(
        job_id=job.id,
        stage=stage,
        attempt=attempt,
        batch_id=job.batch_id,
        type=job.type,
        config=dict(config),
        # The handler gets its own copy: what it does to it must not leak into the stored data.
        state=copy.deepcopy(data.get("state", {})),
        sampling=sampling,
        seed=job.seed,
        node=node,
        trajectory=_trajectory(session, job) if stage is Stage.EVAL else None,
        started_at=now,
        stage_data=data,
        created_at=job.created_at,
        outcome=job.outcome,
        reason=job.reason,
    )


def _trajectory(session: Connection, job: JobRow) -> TrajectoryData | None:
    """RUN's episode for EVAL: from the claim's own row when its statement read it."""
    if "token_ids" in job._fields:
        return attempts.unpack_trajectory(job) if job.token_ids is not None else None
    return attempts.load_trajectory(session, job.id)


def renew_leases(session: Connection, *, job_ids: list[int], worker: str, until: datetime) -> set[int]:
    """Extend the leases ``worker`` holds on these jobs; returns the ids it still owns (a job
    missing from the answer was cancelled, or taken over after this worker stalled)."""
    params = {"ids": job_ids, "_worker": worker, "_until": until}
    return set(session.execute(sql.RENEW_LEASES, params).scalars())


def _owned(session: Connection, job_id: int, stage: Stage, worker: str) -> tuple[JobRow | None, str]:
    """The locked job if this worker still owns ``stage`` of it; else None and why not."""
    job = _lock(session, job_id)
    if job is None:
        return None, "job vanished"
    if job.state is JobState.CANCELLED:
        return None, "cancelled"
    if job.state is PREVIOUS_STATE[stage] and job.stage_done:
        # Nothing moves a job back: the database lost the claim (see _commit_early).
        raise ClaimLost(f"the claim of {stage.value} was lost", job_id=job_id)
    if job.state is not STAGE_STATE[stage] or job.stage_done or job.worker != worker:
        return None, "lease lost: another worker took the stage over"
    return job, ""


@dataclass
class _Result:
    """What a finished stage writes: the job's new column values, and where it goes next."""

    values: dict[str, Any]
    finish: JobState | None = None
    next_stage: Stage | None = None
    task_id: str | None = None


def _result(
    claim: Claim,
    now: datetime,
    init_state: dict[str, Any] | None,
    run_result: RunResult | None,
    eval_result: EvalResult | None,
) -> _Result:
    """The job row after ``claim``'s stage ended with these results (nothing is written here)."""
    stage = claim.stage
    data = claim.stage_data
    timings = dict(data.get("timings", {}))
    if claim.started_at is not None:
        timings[f"{stage.value}_s"] = round((now - claim.started_at).total_seconds(), 6)
    state = dict(data.get("state", {}))
    values: dict[str, Any] = {"stage_done": True, "lease_until": None, "stage_started_at": None}
    result = _Result(values)
    if stage is Stage.INIT:
        state = dict(init_state or {})
    elif stage is Stage.RUN:
        assert run_result is not None
        state.update(run_result.state)
        values.update(outcome=run_result.outcome, reason=run_result.reason)
        if run_result.outcome not in POLICY_OUTCOMES:
            result.finish = JobState.CANCELLED if run_result.outcome is Outcome.CANCELLED else JobState.FAILED
            values.update(_move(claim.job_id, JobState.RUN, result.finish, now))
    else:
        assert eval_result is not None and claim.created_at is not None
        total = (now - claim.created_at).total_seconds()
        timings.update(total_s=round(total, 6), wait_s=round(max(0.0, total - sum(timings.values())), 6))
        result.finish = JobState.DONE
        values.update(_move(claim.job_id, JobState.EVAL, JobState.DONE, now))
        values.update(outcome=claim.outcome or Outcome.OK, reason=claim.reason, reward=eval_result.reward)
    if result.finish is None:
        result.next_stage, result.task_id = NEXT_STAGE[stage], uuid.uuid4().hex
        values["task_id"] = result.task_id
    values["stage_data"] = {"state": state, "timings": timings}
    return result


def complete_next(
    conn: Connection,
    claim: Claim,
    *,
    worker: str,
    now: datetime,
    init_state: dict[str, Any] | None = None,
    run_result: RunResult | None = None,
) -> Completion | None:
    """PostgreSQL: the usual INIT or RUN completion (the job goes on to its next stage) in one
    statement, so it may run on an autocommit connection. None when the result would finish
    the job, or the attempt is no longer the job's: ``complete_stage`` then takes over."""
    result = _result(claim, now, init_state, run_result, None)
    if result.finish is not None or conn.dialect.name != "postgresql":
        return None
    writes = _writes(claim, worker, now, result, run_result, None)
    if not _write_owned(conn, claim, worker, result, writes):
        return None
    return Completion(recorded=True, next_stage=result.next_stage, next_task_id=result.task_id, node=claim.node)


def complete_stage(
    session: Connection,
    claim: Claim,
    *,
    worker: str,
    now: datetime,
    init_state: dict[str, Any] | None = None,
    run_result: RunResult | None = None,
    eval_result: EvalResult | None = None,
) -> Completion:
    """Record a stage's result and decide what comes next. Idempotent per stage: a re-run
    overwrites its own trajectory row rather than adding a second one."""
    result = _result(claim, now, init_state, run_result, eval_result)
    writes = _writes(claim, worker, now, result, run_result, eval_result)
    if not _write_owned(session, claim, worker, result, writes):
        job, why = _owned(session, claim.job_id, claim.stage, worker)
        if job is None:
            return Completion(recorded=False, reason=why)
        # Still ours, but not the attempt this worker claimed (the same worker took the stage
        # over after its lease lapsed): write what the job row says.
        claim = _as_claimed(job, claim.stage)
        result = _result(claim, now, init_state, run_result, eval_result)
        writes = _writes(claim, worker, now, result, run_result, eval_result)
        _set_job(session, claim.job_id, **result.values)
        attempts.write_apart(session, claim.job_id, writes)
    if result.finish is not None:
        _take_finish_seq(session, claim.job_id, claim.batch_id, now)
        return Completion(recorded=True, finished=result.finish)
    _commit_early(session)
    return Completion(recorded=True, next_stage=result.next_stage, next_task_id=result.task_id, node=claim.node)


def _write_owned(session: Connection, claim: Claim, worker: str, result: _Result, writes: attempts.Writes) -> bool:
    """The usual completion: this worker's attempt is still the job's attempt in progress.
    Writes everything and returns True if so; writes nothing otherwise. PostgreSQL does it in
    one statement; SQLite (no writes in WITH) in one per table."""
    guard = {"_job_id": claim.job_id, "_state": STAGE_STATE[claim.stage], "_worker": worker, "_attempt": claim.attempt}
    if session.dialect.name != "postgresql":
        if session.execute(sql.UPDATE_OWNED_ATTEMPT, {**guard, **result.values}).rowcount != 1:
            return False
        attempts.write_apart(session, claim.job_id, writes)
        return True
    params = {
        **guard,
        **{f"_set_{name}": value for name, value in result.values.items()},
        **{f"_run_{name}": value for name, value in writes.attempt.items()},
        **{f"_trajectory_{name}": value for name, value in (writes.trajectory or {}).items()},
        **{f"_score_{name}": value for name, value in (writes.score or {}).items()},
    }
    statement = sql.complete_owned(claim.stage, tuple(result.values))
    return bool(session.execute(statement, params).scalar_one() == 1)


def _writes(
    claim: Claim,
    worker: str,
    now: datetime,
    result: _Result,
    run_result: RunResult | None,
    eval_result: EvalResult | None,
) -> attempts.Writes:
    """The rows the completion of ``claim`` writes besides the job's."""
    timings = result.values["stage_data"]["timings"]
    return attempts.Writes(
        attempt=_attempt_row(claim, worker, now),
        trajectory=attempts.trajectory_row(run_result) if run_result is not None else None,
        score=attempts.score_row(eval_result, timings) if eval_result is not None else None,
    )


def _attempt_row(claim: Claim, worker: str, now: datetime) -> dict[str, Any]:
    """The stage_runs row of the attempt ``claim`` began, completed now."""
    return attempts.attempt_row(
        job_id=claim.job_id,
        stage=claim.stage,
        attempt=claim.attempt,
        status=StageStatus.OK,
        node=claim.node,
        worker=worker,
        started_at=claim.started_at,
        now=now,
    )


def _as_claimed(job: JobRow, stage: Stage) -> Claim:
    """A claim rebuilt from a locked job row (for the completion's locking path)."""
    return Claim(
        job_id=job.id,
        stage=stage,
        attempt=job.stage_attempts,
        batch_id=job.batch_id,
        node=job.node,
        started_at=job.stage_started_at,
        stage_data=job.stage_data or {},
        created_at=job.created_at,
        outcome=job.outcome,
        reason=job.reason,
    )


def retry_stage(
    session: Connection, *, job_id: int, stage: Stage, worker: str, now: datetime, error: str, resend_until: datetime
) -> str | None:
    """Give the stage back for another attempt; returns the new task id, or None if not owned.

    As with the sweeper, the lease passes to no one until ``resend_until``: if the delayed message
    never arrives, the sweeper sends it again."""
    job, _ = _owned(session, job_id, stage, worker)
    if job is None:
        return None
    attempts.record_unfinished(session, job, StageStatus.RETRY, now, error)
    task_id = uuid.uuid4().hex
    _set_job(session, job_id, lease_until=resend_until, worker=None, task_id=task_id, stage_started_at=None)
    return task_id


def fail_stage(
    session: Connection, *, job_id: int, stage: Stage, worker: str, now: datetime, outcome: Outcome, error: str
) -> bool:
    """The stage failed for good: the job ends ``failed`` with an infrastructure outcome."""
    job, _ = _owned(session, job_id, stage, worker)
    if job is None:
        return False
    attempts.record_unfinished(session, job, StageStatus.ERROR, now, error)
    _finish(session, job, JobState.FAILED, now=now, outcome=outcome, reason=error)
    return True


def _finish(
    session: Connection, job: JobRow, state: JobState, *, now: datetime, outcome: Outcome, reason: str | None
) -> None:
    """Move a locked job to a terminal state, at the next place in its batch's finish order
    (taken now, under the batch row lock)."""
    values = _move(job.id, job.state, state, now)
    seq = _take_finish_seqs(session, job.batch_id, 1, now)
    _set_job(session, job.id, **values, outcome=outcome, reason=reason, finish_seq=seq)


def _take_finish_seq(session: Connection, job_id: int, batch_id: int, now: datetime) -> None:
    """Give a finished job (locked by this transaction) the next place in its batch's finish order."""
    if session.dialect.name == "postgresql":
        session.execute(sql.FINISH_AT_NEXT_SEQ, {"_job_id": job_id, "_batch_id": batch_id, "_count": 1, "_now": now})
    else:
        _set_job(session, job_id, finish_seq=_take_finish_seqs(session, batch_id, 1, now))


def _take_finish_seqs(session: Connection, batch_id: int, count: int, now: datetime) -> int:
    """Reserve ``count`` finish positions under the batch row lock; returns the first one.
    The same statement marks a running batch complete when these were its last jobs.

    Taking them under the lock makes finish order equal commit order within a batch, so a
    results cursor never skips a job that commits late."""
    finished = session.execute(sql.TAKE_FINISH_SEQS, {"_batch_id": batch_id, "_count": count, "_now": now}).scalar_one()
    return int(finished) - count + 1


def cancel_batch(session: Connection, *, batch_id: int, now: datetime) -> list[str]:
    """Cancel every unfinished job of a batch; returns the Celery task ids to revoke."""
    jobs = session.execute(
        select(*sql.JOB_COLUMNS)
        .where(Job.batch_id == batch_id, Job.state.not_in(list(TERMINAL_STATES)))
        .order_by(Job.id)
        .with_for_update()
    ).all()
    # Marked cancelled before the finish positions are taken, so the last one does not mark it complete.
    session.execute(
        update(Batch)
        .where(Batch.id == batch_id, Batch.state == BatchState.RUNNING)
        .values(state=BatchState.CANCELLED, finished_at=now)
    )
    if not jobs:
        return []
    first = _take_finish_seqs(session, batch_id, len(jobs), now)
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
                "reason": "batch cancelled",
                "finish_seq": first + offset,
                "finished_at": now,
                "lease_until": None,
                "stage_started_at": None,
            }
        )
    session.execute(sql.UPDATE_JOB, rows)
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
    jobs = session.execute(
        select(*sql.JOB_COLUMNS)
        .where(Job.state.in_(list(STAGE_STATE.values())), Job.stage_done.is_(False), Job.lease_until < now)
        .order_by(Job.lease_until)
        .limit(limit)
        .with_for_update(skip_locked=True)
    ).all()
    out = []
    found_at = utcnow()
    for job in jobs:
        attempts.record_unfinished(session, job, StageStatus.LOST, found_at, LOST_ERROR)
        task_id = uuid.uuid4().hex
        _set_job(session, job.id, lease_until=resend_until, worker=None, task_id=task_id, stage_started_at=None)
        out.append((job.id, STATE_STAGE[job.state], job.node, task_id))
    return out
