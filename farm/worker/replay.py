"""``farm replay JOB``: a finished job's recorded tool calls run again here, without the model.

This is worker-side code, run by the CLI in its own process, for the same reasons as ``farm
reverify``: the API never loads handlers or makes sandboxes, and a replay needs both; the machine
that runs it needs the sandbox runtime a worker node has, and the database settings a worker has.
It reads the job from PostgreSQL (its group's config, its RUN state with the action record, its
reward and trajectory) and writes nothing: no queue, no backend slot, no change to the job.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

from sqlalchemy.engine import Engine

from farm.agent.handler import AgentHandler
from farm.agent.replay import RecordedRun, ReplayReport, replay
from farm.config import Settings
from farm.constants import Stage
from farm.db import stored
from farm.db.jobs import attempts
from farm.errors import NotReplayable
from farm.handlers.base import StageContext
from farm.handlers.registry import get_handler
from farm.llm.trajectory import ChatTokenizer
from farm.proxy.parsers import ParserNames
from farm.schemas import SamplingParams
from farm.schemas.trials import TrialHistory
from farm.worker.sandboxes import SandboxResources


class _NoModel:
    """The context's ``llm``: replay never samples, and teardown's release of a slot is a no-op."""

    @property
    def tokenizer(self) -> ChatTokenizer:
        raise NotReplayable("a replay has no model: this handler asked for the tokenizer")

    @property
    def parsers(self) -> ParserNames:
        raise NotReplayable("a replay has no model: this handler asked for its parsers")

    def session(self, job_id: int) -> Any:
        raise NotReplayable("a replay has no model: this handler asked for an LLM session", job_id=job_id)

    def release(self, job_id: int) -> None:
        return None


def load_run(engine: Engine, job_id: int) -> tuple[RecordedRun, SamplingParams, TrialHistory]:
    """The job as stored, and its batch's sampling parameters and history policy.

    Raises:
        JobNotFound: no such job.
    """
    with engine.connect() as conn:
        job = stored.job(conn, job_id)
        sampling = stored.sampling(conn, job.batch_id)
        history = stored.history(conn, job.batch_id)
        trajectory = attempts.load_trajectory(conn, job_id)
    run = RecordedRun(**vars(job), trajectory=trajectory)
    return run, sampling, history


def replay_job(settings: Settings, engine: Engine, job_id: int) -> ReplayReport:
    """Replay job ``job_id`` in a fresh sandbox on this machine (blocking).

    Raises:
        JobNotFound: no such job.
        NotReplayable: the job is not an agent task, or holds no action record.
        HandlerNotFound: its task type is not installed here.
        SandboxError: the sandbox could not be made.
    """
    run, sampling, history = load_run(engine, job_id)
    handler = get_handler(run.type)
    if not isinstance(handler, AgentHandler):
        raise NotReplayable(f"job {job_id} is a {run.type!r} task, not one of the built-in agent loop", job_id=job_id)
    config = handler.validate(run.config)
    worker = settings.worker
    ctx = StageContext(
        job_id=run.job_id,
        batch_id=run.batch_id,
        stage=Stage.RUN,
        attempt=1,
        node=worker.node,
        sampling=sampling,
        seed=run.seed,
        deadline=time.monotonic() + worker.init_timeout_s + worker.run_timeout_s + worker.eval_timeout_s,
        history=history,  # the prompts are rebuilt as the recorded run built them
        llm=_NoModel(),
        sandboxes=SandboxResources(settings),
    )
    return asyncio.run(replay(handler, config, run, ctx))
