"""Scoring a batch's finished rollouts again with the grader installed now (``farm reverify``).

Everything EVAL reads is already stored when a job is done: its config (the group's), its state
from RUN in ``jobs.stage_data["state"]`` (the math answer in ``final_text``/``submitted``, the
code ``solution``, the swe ``patch``, the generate ``reply``) and its trajectory. So a rollout
can be scored again without the model (the context has no LLM) and without the agent. Handlers
whose grader reads something that is gone once the job ends (harbor's verifier reads the agent's
sandbox) say so with ``reverify_safe = False``; they are refused unless forced.

This is worker-side code, run by the CLI in its own process: the API never loads handlers, and
code and swe graders need the node's sandbox runtime. Stored rewards are never changed: with
``record`` the new score is kept next to them, in ``stage_data["reverify"]``.
"""

from __future__ import annotations

import asyncio
import copy
import time
import traceback
from dataclasses import dataclass, field
from typing import Any

from sqlalchemy import select, update
from sqlalchemy.engine import Engine

from farm.config import Settings
from farm.constants import Stage
from farm.db import stored
from farm.db.base import utcnow
from farm.db.jobs import attempts
from farm.db.models import Job
from farm.db.stored import StoredJob
from farm.errors import FarmError, ReverifyRefused
from farm.handlers.base import StageContext, TaskHandler
from farm.handlers.registry import get_handler
from farm.schemas import SamplingParams
from farm.worker.sandboxes import SandboxResources

#: the key of ``jobs.stage_data`` a recorded re-verification is kept under.
REVERIFY_KEY = "reverify"
#: a rescore's error message is cut to this many characters.
MAX_ERROR_CHARS = 2000


@dataclass(frozen=True)
class Rescore:
    """One rollout scored again; ``error`` says why it could not be (then ``new_reward`` is None)."""

    job_id: int
    type: str
    old_reward: float | None
    new_reward: float | None
    error: str | None = None

    @property
    def changed(self) -> bool:
        return self.error is None and self.new_reward != self.old_reward


@dataclass
class ReverifyReport:
    batch_id: int
    rescores: list[Rescore] = field(default_factory=list)
    #: task type -> rollouts of it whose grader is not safe to run again (scored anyway: forced).
    forced: dict[str, int] = field(default_factory=dict)
    recorded: bool = False

    @property
    def changed(self) -> list[Rescore]:
        return [r for r in self.rescores if r.changed]

    @property
    def errors(self) -> list[Rescore]:
        return [r for r in self.rescores if r.error is not None]


@dataclass(frozen=True)
class _Rollout:
    """A done job, with its config validated by the handler that scores it."""

    job: StoredJob
    config: Any
    handler: TaskHandler[Any]


def reverify_batch(
    settings: Settings, engine: Engine, batch_id: int, *, force: bool = False, record: bool = False
) -> ReverifyReport:
    """Score every finished (``done``) rollout of the batch again with the current graders.

    Raises:
        BatchNotFound: no such batch.
        ReverifyRefused: some rollouts' graders are not safe to run again, and ``force`` is false.
        FarmError: a stored job names a task type or config this process cannot load.
    """
    sampling, rollouts = _load(engine, batch_id)
    unsafe: dict[str, int] = {}
    for rollout in rollouts:
        if not rollout.handler.can_reverify(rollout.config):
            unsafe[rollout.job.type] = unsafe.get(rollout.job.type, 0) + 1
    if unsafe and not force:
        listed = ", ".join(f"{name} ({count} rollouts)" for name, count in sorted(unsafe.items()))
        raise ReverifyRefused(
            f"batch {batch_id}: the grader of {listed} reads what is gone once a rollout ends (its sandbox), "
            "so scoring it again is not the same check; use --force to score it anyway",
            unsafe=unsafe,
        )
    report = ReverifyReport(batch_id=batch_id, forced=unsafe)
    sandboxes = SandboxResources(settings)
    report.rescores = asyncio.run(_rescore_all(settings, engine, batch_id, sampling, rollouts, sandboxes))
    if record:
        _record(engine, report, forced=bool(unsafe))
        report.recorded = True
    return report


def _load(engine: Engine, batch_id: int) -> tuple[SamplingParams, list[_Rollout]]:
    with engine.connect() as conn:
        sampling = stored.sampling(conn, batch_id)
        jobs = stored.done_jobs(conn, batch_id)
    handlers: dict[str, TaskHandler[Any]] = {}
    rollouts = []
    for job in jobs:
        handler = handlers.get(job.type) or handlers.setdefault(job.type, get_handler(job.type))
        rollouts.append(_Rollout(job=job, config=handler.validate(job.config), handler=handler))
    return sampling, rollouts


async def _rescore_all(
    settings: Settings,
    engine: Engine,
    batch_id: int,
    sampling: SamplingParams,
    rollouts: list[_Rollout],
    sandboxes: SandboxResources,
) -> list[Rescore]:
    out = []
    for rollout in rollouts:  # one at a time: graders that run test suites are heavy
        job = rollout.job
        try:
            reward: float | None = await _rescore(settings, engine, batch_id, sampling, rollout, sandboxes)
            error = None
        except Exception as exc:  # a rollout that cannot be scored is reported, the others still are
            reward, error = None, f"{type(exc).__name__}: {exc}"
            if not isinstance(exc, FarmError):
                error += "\n" + "".join(traceback.format_exception(exc))
        out.append(Rescore(job.job_id, job.type, job.reward, reward, error[:MAX_ERROR_CHARS] if error else None))
    return out


async def _rescore(
    settings: Settings,
    engine: Engine,
    batch_id: int,
    sampling: SamplingParams,
    rollout: _Rollout,
    sandboxes: SandboxResources,
) -> float:
    job = rollout.job
    with engine.connect() as conn:
        trajectory = attempts.load_trajectory(conn, job.job_id)
    if trajectory is None:
        raise FarmError(f"job {job.job_id} has no stored trajectory", job_id=job.job_id)
    timeout_s = settings.worker.eval_timeout_s
    ctx = StageContext(
        job_id=job.job_id,
        batch_id=batch_id,
        stage=Stage.EVAL,
        attempt=1,
        node=settings.worker.node,
        sampling=sampling,
        seed=job.seed,
        deadline=time.monotonic() + timeout_s,
        sandboxes=sandboxes,  # no llm: a grader that reaches for the model fails, loudly
    )
    # The handler gets its own copy of the state, as a stage does.
    result = await asyncio.wait_for(
        rollout.handler.evaluate(rollout.config, rollout.handler.load_state(copy.deepcopy(job.state)), trajectory, ctx),
        timeout=timeout_s,
    )
    return float(result.reward)


def _record(engine: Engine, report: ReverifyReport, *, forced: bool) -> None:
    """Keep each new score next to the stored one (``stage_data["reverify"]``); rewards stay as they were."""
    now = utcnow().isoformat()
    with engine.begin() as conn:
        for rescore in report.rescores:
            if rescore.error is not None:
                continue
            data = conn.execute(select(Job.stage_data).where(Job.id == rescore.job_id)).scalar_one()
            entry = {"reward": rescore.new_reward, "previous_reward": rescore.old_reward, "at": now, "forced": forced}
            conn.execute(
                update(Job).where(Job.id == rescore.job_id).values(stage_data={**(data or {}), REVERIFY_KEY: entry})
            )
