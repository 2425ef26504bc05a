"""What a stage does, independent of Celery: claim the job, call the handler, record the
result, then (after the commit) send the next stage to the job's node.

Failures are sorted here: the handler's own results (wrong answers, agent errors) are data;
a ``FarmError`` is an infrastructure problem, retried up to ``max_attempts``
and then reported with its outcome; any other exception is a handler bug (``handler_error``).
"""

from __future__ import annotations

import logging
import time
import traceback
from collections.abc import Callable, Coroutine
from dataclasses import dataclass
from datetime import timedelta
from typing import Any, TypeVar

import psycopg
from celery import Celery
from psycopg_pool import PoolTimeout
from redis.exceptions import RedisError
from sqlalchemy.exc import SQLAlchemyError

from farm import metrics, signals
from farm.constants import POLICY_OUTCOMES, Outcome, Stage, batch_events_channel
from farm.db import teardowns
from farm.db.base import utcnow
from farm.db.jobs import claims, completions, lifecycle
from farm.db.session import waiting_out
from farm.deadlines.limits import Limits, resolve
from farm.errors import FarmError
from farm.handlers.base import StageContext, TaskHandler
from farm.handlers.registry import get_handler
from farm.schemas import EvalResult, RunResult, SamplingParams
from farm.worker import deadlines, dynamic
from farm.worker.app import FarmRuntime
from farm.worker.enqueue import send_stage
from farm.worker.lease import Lease
from farm.worker.staleness import Verdict

log = logging.getLogger(__name__)

T = TypeVar("T")

#: the longest a handler's teardown may take before the stage moves on.
TEARDOWN_TIMEOUT_S = 120.0
#: the most of a traceback kept in a job's reason.
MAX_REASON_CHARS = 4000


@dataclass(frozen=True)
class StageReport:
    """What one delivery of a stage message did (for logs and tests)."""

    job_id: int
    stage: Stage
    action: str  # completed | skipped | discarded | retry | failed
    detail: str | None = None
    task_type: str | None = None


@dataclass(frozen=True)
class _Attempt:
    """The stage a delivery claimed and is running: what its failure paths need."""

    claim: claims.Claim
    worker: str
    handler: TaskHandler[Any]
    config: Any
    ctx: StageContext


class _LimitReached(Exception):
    """The stage ran past its limit (or the job's wall budget) and was stopped: the job ends ``timeout``."""


def _await(rt: FarmRuntime, coro: Coroutine[Any, Any, T], *, timeout_s: float) -> T:
    """Run a handler's stage method on the process's event loop."""
    try:
        return rt.aio.run(coro, timeout_s=timeout_s)
    except TimeoutError as exc:
        raise _LimitReached(f"stopped after {timeout_s:.1f}s") from exc


def store_error(exc: BaseException) -> str | None:
    """``"the database"`` or ``"Redis"`` when ``exc`` (or what it was raised from) is one of their
    client's errors, else None. Handlers reach neither themselves: such an error in a stage is the
    farm's (a proxy call's record, the balancer), whatever the handler wrapped it in."""
    seen: set[int] = set()
    current: BaseException | None = exc
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        if isinstance(current, (SQLAlchemyError, psycopg.Error, PoolTimeout)):
            return "the database"
        if isinstance(current, RedisError):
            return "Redis"
        current = current.__cause__ or current.__context__
    return None


def _first_line(exc: BaseException) -> str:
    return (str(exc).strip().splitlines() or [""])[0][:500]


def _context(rt: FarmRuntime, claim: claims.Claim, deadline: float, lease: Lease | None) -> StageContext:
    return StageContext(
        job_id=claim.job_id,
        batch_id=claim.batch_id,
        stage=claim.stage,
        attempt=claim.attempt,
        node=rt.settings.worker.node,
        sampling=claim.sampling or SamplingParams(),
        seed=claim.seed,
        deadline=deadline,
        history=claim.history,
        is_cancelled=lease.is_cancelled if lease else (lambda: True),
        llm=rt.llm,
        sandboxes=rt.sandboxes,
        trials=rt.trials,
    )


def execute_stage(rt: FarmRuntime, app: Celery, stage: Stage, job_id: int, *, worker: str) -> StageReport:
    """Run one delivery of a stage message to its end; never raises for job-level failures."""
    claim = _claim(rt, stage, job_id, worker)
    if claim.skip is not None:
        return _skipped(rt, app, claim, worker)

    try:
        handler = get_handler(claim.type)
        config = handler.validate(claim.config or {})
    except FarmError as exc:
        return _fail(rt, app, claim, worker, Outcome.HANDLER_ERROR, str(exc))

    limits = resolve(rt.settings.worker, claim.limits)
    allowed_s, limit = limits.allowance(stage, init_at=claim.init_at, now=utcnow())
    if allowed_s <= 0:
        # The job's wall budget ran out between stages: it does not start another.
        attempt = _Attempt(claim, worker, handler, config, _context(rt, claim, time.monotonic(), None))
        _teardown(rt, attempt)
        return _fail(rt, app, claim, worker, Outcome.TIMEOUT, limits.reason(stage, limit))
    deadline = time.monotonic() + allowed_s
    with rt.leases.hold(job_id=job_id, batch_id=claim.batch_id, stage=stage, worker=worker, deadline=deadline) as lease:
        attempt = _Attempt(claim, worker, handler, config, _context(rt, claim, deadline, lease))
        started = time.monotonic()
        try:
            output = _call_stage(rt, attempt, limits)
        except _LimitReached:
            _teardown(rt, attempt)
            return _fail(rt, app, claim, worker, Outcome.TIMEOUT, limits.reason(stage, limit))
        except FarmError as exc:
            return _retry_or_fail(rt, app, attempt, Outcome(exc.outcome), str(exc), limits)
        except Exception as exc:
            if (failed := store_error(exc)) is not None:
                # The farm's database or Redis failed under the handler (a harness call's record, the
                # balancer): the infrastructure's fault, retried like one, never the handler's bug.
                reason = f"{failed} failed during {stage.value}: {type(exc).__name__}: {_first_line(exc)}"
                return _retry_or_fail(rt, app, attempt, Outcome.INFRA_ERROR, reason, limits)
            detail = "".join(traceback.format_exception(exc))[-MAX_REASON_CHARS:]
            _teardown(rt, attempt)
            return _fail(rt, app, claim, worker, Outcome.HANDLER_ERROR, f"{type(exc).__name__}: {exc}\n{detail}")
        if output.run_result is not None and (verdict := _stale(rt, claim, output.run_result)) is not None:
            if verdict.rerun and claim.attempt < limits.max_attempts:
                # Sampled from weights too old to train on: RUN again (in a new sandbox) on the newest.
                _teardown(rt, attempt, produced=output.produced_state())
                return _retry_or_fail(rt, app, attempt, Outcome.INFRA_ERROR, verdict.reason, limits)
            output = _marked_stale(output, verdict)
        # Under the lease still: a completion that waits out an unavailable database keeps the stage
        # its own (renewed once the database is back) instead of the sweeper giving it to another.
        done = _complete(rt, claim, worker, output)

    if not done.recorded:
        if done.reason == "cancelled":
            # What this stage made (INIT's sandbox, say) was not recorded: tear it down too.
            _teardown(rt, attempt, produced=output.produced_state())
            _settle_teardown(rt, job_id)
        log.info("job %s %s: result discarded (%s)", job_id, stage.value, done.reason)
        return StageReport(job_id, stage, "discarded", done.reason, claim.type)
    metrics.record_stage(rt.redis, stage.value, claim.type, time.monotonic() - started)
    signals.episode_recorded(rt.redis, claim.type, claim.batch_id, output.run_result, output.eval_result)
    if done.next_stage is not None:
        send_stage(app, job_id=job_id, stage=done.next_stage, node=done.node, task_id=done.next_task_id)
    if done.finished is not None:
        _teardown(rt, attempt)
        _finished(rt, app, claim)
    return StageReport(job_id, stage, "completed", done.finished.value if done.finished else None, claim.type)


def _claim(rt: FarmRuntime, stage: Stage, job_id: int, worker: str) -> claims.Claim:
    """The usual claim in one autocommitted statement where the database allows it; anything
    else in a transaction, under the job row lock."""
    settings = rt.settings.worker
    common: dict[str, Any] = {
        "job_id": job_id,
        "stage": stage,
        "node": settings.node,
        "worker": worker,
        "lease_s": settings.lease_s,
        "samplings": rt.samplings,
    }

    def claim() -> claims.Claim:
        # The time of each try: a claim granted after waiting out the database leases the stage from
        # then, not from the first try (a lease already lapsed would be swept and the stage run twice).
        now = utcnow()
        if (autocommit := rt.autocommit()) is not None:
            with autocommit.connect() as conn:
                granted = claims.claim_next(conn, now=now, **common)
            if granted is not None:
                return granted
        with rt.engine.begin() as session:
            return claims.claim_stage(session, max_attempts=settings.max_attempts, now=now, **common)

    return _waiting_out(rt, claim, f"job {job_id} {stage.value}: claim")


def _complete(
    rt: FarmRuntime, claim: claims.Claim, worker: str, output: completions.StageOutput
) -> completions.Completion:
    """Record the stage's result in one autocommitted statement where the database allows it,
    waiting for the disk only if it finishes the job; anything else (an attempt this worker no
    longer holds as claimed, SQLite) in a transaction."""
    durable = completions.finishes(claim.stage, output.run_result)

    def complete() -> completions.Completion:
        # Taken at each try: after waiting out the database, the owed next stage is due a lease from now.
        now = utcnow()
        owed_until = now + timedelta(seconds=rt.settings.worker.lease_s)
        if (autocommit := rt.autocommit(durable=durable)) is not None:
            with autocommit.connect() as conn:
                done = completions.complete_next(conn, claim, output, worker=worker, now=now, owed_until=owed_until)
            if done is not None:
                return done
        with rt.engine.begin() as session:
            return completions.complete_stage(session, claim, output, worker=worker, now=now, owed_until=owed_until)

    return _waiting_out(rt, complete, f"job {claim.job_id} {claim.stage.value}: completion")


def _waiting_out(rt: FarmRuntime, call: Callable[[], T], what: str) -> T:
    """``call()``, waiting out a database that is full, restarting or out of free connections
    (``database.unavailable_wait_s``): that costs the stage time, never an attempt. Past the wait
    the error reaches the stage task, which hands the message back to its queue."""
    return waiting_out(call, settings=rt.settings, what=what, log=log)


def _call_stage(rt: FarmRuntime, attempt: _Attempt, limits: Limits) -> completions.StageOutput:
    handler, config, claim, ctx = attempt.handler, attempt.config, attempt.claim, attempt.ctx
    # The farm's limit, whatever the handler does: a handler may end on its own at ctx.deadline (an
    # agent_timeout, scored); one still running limit_grace_s later is cancelled, the job ends timeout.
    limit_s = max(ctx.remaining_s(), 0.0) + limits.grace_s
    # The state crosses processes as JSON: checked against the handler's state_class where a stage
    # hands it on, and read back as one (a state that does not fit is the handler's error).
    if ctx.stage is Stage.INIT:
        made = _await(rt, handler.init(config, ctx), timeout_s=limit_s)
        return completions.StageOutput(init_state=handler.stored_state(made))
    state = handler.load_state(claim.state)
    if ctx.stage is Stage.RUN:
        run_result = _await(rt, handler.run(config, state, ctx), timeout_s=limit_s)
        if not isinstance(run_result, RunResult):
            raise TypeError(f"{type(handler).__name__}.run returned {type(run_result).__name__}, not RunResult")
        state.updated(run_result.state)
        return completions.StageOutput(run_result=run_result)
    if claim.trajectory is None:
        raise FarmError("EVAL found no trajectory from RUN", job_id=claim.job_id)
    eval_result = _await(rt, handler.evaluate(config, state, claim.trajectory, ctx), timeout_s=limit_s)
    if not isinstance(eval_result, EvalResult):
        raise TypeError(f"{type(handler).__name__}.evaluate returned {type(eval_result).__name__}, not EvalResult")
    # What RUN noted about the episode stays next to what EVAL adds.
    info = {**claim.trajectory.info, **eval_result.info}
    return completions.StageOutput(eval_result=eval_result.model_copy(update={"info": info}))


def _stale(rt: FarmRuntime, claim: claims.Claim, run_result: RunResult) -> Verdict | None:
    if run_result.outcome not in POLICY_OUTCOMES:
        return None  # nothing to train on either way
    return rt.staleness.judge(claim.batch_id, run_result.trajectory.weight_versions)


def _marked_stale(output: completions.StageOutput, verdict: Verdict) -> completions.StageOutput:
    """RUN's output kept, marked stale (its trajectory's info says how far behind it was)."""
    assert output.run_result is not None
    trajectory = output.run_result.trajectory
    info = {**trajectory.info, "stale": {"oldest_version": verdict.oldest, "newest_version": verdict.newest}}
    run_result = output.run_result.model_copy(update={"trajectory": trajectory.model_copy(update={"info": info})})
    return completions.StageOutput(run_result=run_result, stale=True)


def _skipped(rt: FarmRuntime, app: Celery, claim: claims.Claim, worker: str) -> StageReport:
    if claim.gave_up:
        _finished(rt, app, claim)
    # A job cancelled (or given up) while its next stage waited in the queue still holds what
    # INIT made on this node: release it here, where it lives.
    if claim.stage is not Stage.INIT and claim.config is not None and claim.node == rt.settings.worker.node:
        try:
            handler = get_handler(claim.type)
            config = handler.validate(claim.config)
        except FarmError:
            pass
        else:
            ctx = _context(rt, claim, time.monotonic() + 60, None)
            _teardown(rt, _Attempt(claim, worker, handler, config, ctx))
            _settle_teardown(rt, claim.job_id)
    log.info("job %s %s: skipped (%s)", claim.job_id, claim.stage.value, claim.skip)
    return StageReport(claim.job_id, claim.stage, "skipped", claim.skip, claim.type)


def _retry_or_fail(
    rt: FarmRuntime, app: Celery, attempt: _Attempt, outcome: Outcome, error: str, limits: Limits
) -> StageReport:
    claim, worker = attempt.claim, attempt.worker
    stage = claim.stage
    if claim.attempt < limits.max_attempts:
        delay = rt.settings.worker.retry_delay_s

        def retry() -> str | None:
            now = utcnow()
            with rt.engine.begin() as session:
                return lifecycle.retry_stage(
                    session,
                    job_id=claim.job_id,
                    stage=stage,
                    worker=worker,
                    now=now,
                    error=error,
                    resend_until=now + timedelta(seconds=delay + rt.settings.worker.lease_s),
                )

        task_id = _waiting_out(rt, retry, f"job {claim.job_id} {stage.value}: retry")
        if task_id is not None:
            send_stage(app, job_id=claim.job_id, stage=stage, node=claim.node, task_id=task_id, countdown=delay)
            log.warning(
                "job %s %s attempt %s failed, retry in %.1fs: %s",
                claim.job_id,
                stage.value,
                claim.attempt,
                delay,
                error,
            )
            return StageReport(claim.job_id, stage, "retry", error, claim.type)
    _teardown(rt, attempt)
    if "max_attempts" in limits.by_batch:
        error = f"{stage.value} reached the batch's limit {limits.named('max_attempts')}: {error}"
        outcome = Outcome.TIMEOUT
    return _fail(rt, app, claim, worker, outcome, error)


def _fail(rt: FarmRuntime, app: Celery, claim: claims.Claim, worker: str, outcome: Outcome, error: str) -> StageReport:
    def fail() -> None:
        with rt.engine.begin() as session:
            lifecycle.fail_stage(
                session,
                job_id=claim.job_id,
                stage=claim.stage,
                worker=worker,
                now=utcnow(),
                outcome=outcome,
                error=error,
            )

    _waiting_out(rt, fail, f"job {claim.job_id} {claim.stage.value}: failure")
    _finished(rt, app, claim)
    log.error(
        "job %s %s failed (%s): %s", claim.job_id, claim.stage.value, outcome.value, (error.splitlines() or [""])[0]
    )
    return StageReport(claim.job_id, claim.stage, "failed", error, claim.type)


def _teardown(rt: FarmRuntime, attempt: _Attempt, *, produced: dict[str, Any] | None = None) -> None:
    claim = attempt.claim
    try:
        state = attempt.handler.load_state({**(claim.state or {}), **(produced or {})})
        _await(rt, attempt.handler.teardown(attempt.config, state, attempt.ctx), timeout_s=TEARDOWN_TIMEOUT_S)
    except Exception:  # a failed cleanup must not change how the job is reported
        log.exception("job %s: teardown failed", claim.job_id)


def _settle_teardown(rt: FarmRuntime, job_id: int) -> None:
    """The job's sandbox on this node is gone: the teardown a cancel left owed is paid."""
    try:
        with rt.engine.begin() as session:
            teardowns.settle(session, job_id)
    except Exception:  # still owed: the reconciler sends the message again and this runs again
        log.warning("job %s: cannot record its teardown as done", job_id, exc_info=True)


def _finished(rt: FarmRuntime, app: Celery, claim: claims.Claim) -> None:
    """A job ended: long-polls hear it, and a dynamic batch decides the job's group if it was its last."""
    _publish_finished(rt, claim.batch_id)
    try:
        dynamic.job_finished(rt, app, batch_id=claim.batch_id, job_id=claim.job_id)
    except Exception:  # the sweeper decides the group on its next round
        log.exception("job %s: cannot settle its group now", claim.job_id)
    if claim.has_quorum:
        try:
            deadlines.settle(rt, app, claim.batch_id)
        except Exception:  # the sweeper settles it on its next round
            log.exception("batch %s: cannot settle its quorum now", claim.batch_id)


def _publish_finished(rt: FarmRuntime, batch_id: int) -> None:
    try:
        rt.redis.publish(batch_events_channel(batch_id), "finished")
    except Exception:  # long-polls fall back to polling the database
        log.warning("batch %s: cannot publish a finish event", batch_id, exc_info=True)
