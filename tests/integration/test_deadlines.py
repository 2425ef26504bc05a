"""Deadlines on a real farm: limits a batch sets end its jobs with outcome timeout (whatever the
handler does, its sandbox torn down), a quorum makes a batch ready with its rest cut or carried, and
carried jobs reach the trainer once, through its cursor, at a later step."""

from __future__ import annotations

import asyncio
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import create_engine, select

from farm.client import CarryCursor, FarmClient
from farm.constants import BatchState, JobState, Outcome
from farm.db.models import Job
from farm.embedded import EmbeddedStack
from farm.handlers.base import StageContext
from farm.handlers.echo import EchoConfig, EchoHandler, EchoState
from farm.schemas import RunResult
from tests.integration.conftest import stack_settings, wait_until

pytestmark = [pytest.mark.integration, pytest.mark.timeout(180)]


class HangingEchoHandler(EchoHandler):
    """An echo whose INIT makes a "sandbox" (a directory named by the config's text, one per job) and
    whose RUN hangs, deaf to its deadline and to cancels; teardown removes the directory."""

    async def init(self, config: EchoConfig, ctx: StageContext) -> EchoState:
        (Path(config.text) / str(ctx.job_id)).mkdir(parents=True)
        return await super().init(config, ctx)

    async def run(self, config: EchoConfig, state: EchoState, ctx: StageContext) -> RunResult:
        await asyncio.sleep(3600)
        raise AssertionError("unreachable")

    async def teardown(self, config: EchoConfig, state: EchoState, ctx: StageContext) -> None:
        shutil.rmtree(Path(config.text) / str(ctx.job_id), ignore_errors=True)


HANGING = "tests.integration.test_deadlines:HangingEchoHandler"


@pytest.fixture(scope="module")
def farm(tmp_path_factory: pytest.TempPathFactory, module_pg_url: str, redis_url: str) -> Iterator[EmbeddedStack]:
    """A farm whose stages past a limit are stopped half a second after it (the default is 5 s)."""
    import redis

    client = redis.Redis.from_url(redis_url)
    client.flushdb()
    settings = stack_settings(tmp_path_factory.mktemp("deadlines"), redis_url=redis_url, database_url=module_pg_url)
    worker = settings.worker.model_copy(update={"limit_grace_s": 0.5})
    settings = settings.model_copy(update={"worker": worker, "handler_paths": [*settings.handler_paths, HANGING]})
    stack = EmbeddedStack(settings, with_flower=False, with_llm=False)
    stack.start()
    yield stack
    stack.stop()
    client.flushdb()
    client.close()


@pytest.fixture
def client(farm: EmbeddedStack) -> Iterator[FarmClient]:
    with FarmClient(farm.settings.api_url, token="e2e-token") as c:
        yield c


def echo(i: int, run_s: float = 0.0) -> dict[str, Any]:
    return {"type": "echo", "name": f"t{i}", "config": {"text": f"task {i}", "sleep_s": {"run": run_s}}}


def jobs_of(farm: EmbeddedStack, batch_id: int) -> list[Any]:
    engine = create_engine(farm.settings.database_url)
    try:
        with engine.connect() as conn:
            return list(conn.execute(select(Job).where(Job.batch_id == batch_id).order_by(Job.id)).all())
    finally:
        engine.dispose()


def test_a_stage_past_its_batch_limit_ends_timeout_and_its_sandbox_is_torn_down(
    farm: EmbeddedStack, client: FarmClient, tmp_path: Path
):
    # Given a RUN that ignores its deadline and every cancel
    boxes = tmp_path / "boxes"
    batch = client.submit([{"type": HANGING, "config": {"text": str(boxes)}}], limits={"run_s": 1.0})

    # When its batch's RUN limit passes
    [result] = list(client.results(batch.id, wait_s=5))

    # Then the farm stops it: outcome timeout, the reason naming the stage and the limit, no retry
    assert result.job.state is JobState.FAILED and result.job.outcome is Outcome.TIMEOUT
    # Its worker stops it; under heavy load the sweeper may be first: "(ended by the farm)" then.
    assert result.job.reason is not None and result.job.reason.startswith("run ran past its limit limits.run_s=1s")
    assert result.job.attempts == 2, "INIT and one RUN: a limit is not retried"
    # Torn down by the stage's worker, or (ended by the sweeper) through the teardown owed with the end.
    wait_until(lambda: list(boxes.iterdir()) == [], timeout_s=15, what="the sandbox INIT made torn down")
    assert client.status(batch.id).limits is not None


def test_a_job_past_its_wall_budget_ends_timeout_naming_it(client: FarmClient):
    batch = client.submit(
        [{"type": "echo", "config": {"text": "slow", "sleep_s": {"init": 0.6, "run": 0.6, "eval": 5}}}],
        limits={"job_wall_s": 1.5},
    )
    [result] = list(client.results(batch.id, wait_s=5))
    assert result.job.outcome is Outcome.TIMEOUT
    assert result.job.reason is not None and "wall budget limits.job_wall_s=1.5s in eval" in result.job.reason


def test_an_attempts_limit_ends_the_job_timeout_after_that_many_attempts(client: FarmClient):
    task = {"type": "echo", "config": {"text": "flaky", "fail_stage": "run", "fail_attempts": 5}}
    batch = client.submit([task], limits={"max_attempts": 2})
    [result] = list(client.results(batch.id, wait_s=5))
    assert result.job.outcome is Outcome.TIMEOUT
    assert result.job.reason is not None and result.job.reason.startswith("run reached the batch's limit")
    assert "limits.max_attempts=2" in result.job.reason
    assert result.job.attempts == 3, "INIT once, RUN twice"


def test_a_quorum_with_rest_cancel_is_ready_at_its_quorum_and_cuts_the_rest(farm: EmbeddedStack, client: FarmClient):
    tasks = [echo(i) for i in range(8)] + [echo(8 + i, run_s=60) for i in range(2)]
    batch = client.submit(tasks, quorum={"min_jobs": 8, "rest": "cancel"})

    step = client.step(batch.id, wait_s=5)

    assert step.ready_reason == "quorum"
    assert len(step.results) >= 8 and all(r.job.outcome is Outcome.OK for r in step.results)
    status = client.status(batch.id)
    assert status.readiness is not None and status.readiness.ready and status.readiness.ready_seq == len(step.results)
    assert status.state is BatchState.COMPLETE and status.readiness.cut == 10 - len(step.results)
    cut = [j for j in jobs_of(farm, batch.id) if j.state is JobState.CANCELLED]
    assert len(cut) == 10 - len(step.results)
    assert all(j.outcome is Outcome.CANCELLED for j in cut)
    assert all(j.reason.startswith("cut: the batch was ready at its quorum (8 of 10 jobs finished)") for j in cut)


def test_a_deadline_makes_the_batch_ready_with_what_it_has(farm: EmbeddedStack, client: FarmClient):
    tasks = [echo(i) for i in range(2)] + [echo(2 + i, run_s=60) for i in range(3)]
    batch = client.submit(tasks, quorum={"min_fraction": 0.9, "deadline_s": 2.0})

    step = client.step(batch.id, wait_s=10)

    assert step.ready_reason == "deadline"
    assert [r.job.outcome for r in step.results] == [Outcome.OK, Outcome.OK]
    tail = client.tail(batch.id)
    assert tail.cut.jobs == 3 and tail.step.jobs == 2
    assert tail.seconds_to["50%"] is None, "3 of 5 were cut: half the batch never finished"


def test_carried_jobs_reach_the_trainer_once_at_a_later_step(farm: EmbeddedStack, client: FarmClient):
    carry = CarryCursor()
    first = client.submit(
        [echo(i) for i in range(8)] + [echo(8 + i, run_s=3) for i in range(2)],
        quorum={"min_fraction": 0.8, "rest": "carry"},
    )
    step1 = client.step(first.id, carry)
    assert step1.ready_reason == "quorum" and len(step1.results) == 8 and step1.carried == []
    assert carry.pending == {first.id: 8}
    late = {j.id for j in jobs_of(farm, first.id)} - {r.job.id for r in step1.results}

    # The next step's batch finishes after the carried jobs do.
    second = client.submit([echo(20 + i, run_s=4) for i in range(4)], quorum={"min_jobs": 4, "rest": "carry"})
    step2 = client.step(second.id, carry)
    assert {r.job.id for r in step2.carried} == late and [r.seq for r in step2.carried] == [9, 10]
    assert all(r.job.outcome is Outcome.OK and r.trajectory is not None for r in step2.carried)
    assert first.id not in carry.pending, "a batch read to its end leaves the cursor"

    third = client.submit([echo(30)], quorum={"min_jobs": 1, "rest": "carry"})
    assert client.step(third.id, CarryCursor.from_json(carry.to_json())).carried == [], "never twice"
    tail = client.tail(first.id)
    assert tail.carried.jobs == 2 and tail.step.jobs == 8
    assert tail.seconds_to["100%"] is not None and tail.seconds_to["100%"] >= 3


def test_a_batch_that_finishes_before_anyone_settles_it_is_ready(farm: EmbeddedStack, client: FarmClient):
    batch = client.submit([echo(i) for i in range(3)], quorum={"min_fraction": 1.0})
    step = client.step(batch.id, wait_s=5)
    assert len(step.results) == 3 and step.ready_reason == "quorum"
    readiness = client.status(batch.id).readiness
    assert readiness is not None and readiness.ready_seq == 3 and readiness.carried == readiness.cut == 0
