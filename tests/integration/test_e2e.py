"""End to end: real `farm api` and `farm worker` processes (one per queue) on real Redis and
PostgreSQL, driven through the client library."""

from __future__ import annotations

import os
import signal
from urllib.parse import urlparse

import numpy as np
import pytest
from sqlalchemy import create_engine, func, select
from sqlalchemy.exc import OperationalError

from farm.client import FarmClient, to_arrays
from farm.constants import BatchState, JobState, Outcome, Stage, StageStatus
from farm.db.models import Trajectory
from farm.embedded import EmbeddedStack
from farm.handlers.echo import EchoHandler
from tests.integration.conftest import wait_until
from tests.trajectories import trajectories

pytestmark = [pytest.mark.integration, pytest.mark.timeout(180)]


def echo(text: str, **config) -> dict:
    return {"type": "echo", "config": {"text": text, **config}}


def test_batch_runs_end_to_end_and_arrays_match_trajectories(client: FarmClient):
    tasks = [echo(f"task number {i}" * (i + 1), noise=0.3, reverse=i % 2 == 0) for i in range(5)]
    batch = client.submit(tasks, group_size=3, sampling={"seed": 11})
    assert len(batch.job_ids) == 15

    results = list(client.results(batch.id, wait_s=5))

    assert sorted(r.job.id for r in results) == sorted(batch.job_ids)
    assert [r.seq for r in results] == list(range(1, 16))
    assert all(r.job.state is JobState.DONE and r.job.outcome is Outcome.OK for r in results)
    trajs = trajectories(results)
    assert all(t.reward is not None and 0.0 <= t.reward <= 1.0 for t in trajs)
    assert len({t.reward for t in trajs}) > 1, "noise 0.3 with distinct seeds should give varied rewards"

    arrays = to_arrays(trajs, pad_side="left", pad_token_id=0)
    lengths = np.array([t.num_tokens for t in trajs])
    width = lengths.max()
    assert arrays["input_ids"].shape == (15, width) and arrays["rewards"].shape == (15,)
    assert (arrays["attention_mask"].sum(axis=1) == lengths).all()
    assert (arrays["attention_mask"][:, -1] == 1).all(), "left padding puts every sequence's end in the last column"
    assert ((arrays["loss_mask"] == 1) <= (arrays["attention_mask"] == 1)).all()
    assert (arrays["old_logprobs"][arrays["loss_mask"] == 0] == 0).all()
    # The padded arrays hold the same tokens the API returns for each job.
    for row, r in enumerate(results):
        plain = client.trajectory(r.job.id, encoding="json")
        assert arrays["input_ids"][row, width - lengths[row] :].tolist() == plain.token_ids
        assert arrays["loss_mask"][row, width - lengths[row] :].tolist() == plain.loss_mask
    status = client.status(batch.id)
    assert status.state is BatchState.COMPLETE and status.counts[JobState.DONE] == 15


def test_job_history_shows_each_stage_on_the_init_node(client: FarmClient):
    batch = client.submit([echo("history")])
    client.wait(batch.id, timeout_s=60)
    job = client.job(batch.job_ids[0])
    assert [(s.stage, s.status, s.node) for s in job.stages] == [
        (Stage.INIT, StageStatus.OK, "testnode"),
        (Stage.RUN, StageStatus.OK, "testnode"),
        (Stage.EVAL, StageStatus.OK, "testnode"),
    ]
    assert job.init_at and job.run_at and job.eval_at and job.finished_at
    assert job.node == "testnode" and job.init_at <= job.run_at <= job.eval_at <= job.finished_at


def test_results_arrive_while_the_rest_of_the_batch_still_runs(client: FarmClient):
    tasks = [echo("fast")] * 2 + [echo("slow", sleep_s={"run": 6})] * 2
    batch = client.submit(tasks)
    first = next(iter(client.results(batch.id, wait_s=20)))
    assert first.job.type == "echo" and first.trajectory is not None
    assert client.status(batch.id).state is BatchState.RUNNING
    client.wait(batch.id, timeout_s=60)


def test_infrastructure_fault_is_retried_then_succeeds(client: FarmClient):
    batch = client.submit([echo("flaky", fail_stage="run", fail_attempts=1)])
    client.wait(batch.id, timeout_s=60)
    job = client.job(batch.job_ids[0])
    assert job.state is JobState.DONE and job.outcome is Outcome.OK
    runs = [(s.attempt, s.status) for s in job.stages if s.stage is Stage.RUN]
    assert runs == [(1, StageStatus.RETRY), (2, StageStatus.OK)]
    assert "simulated run failure" in (next(s.error for s in job.stages if s.status is StageStatus.RETRY) or "")


class BuggyEchoHandler(EchoHandler):
    """An echo whose RUN has a bug: the farm loads it by its dotted path."""

    async def run(self, config, state, ctx):
        raise KeyError("a handler bug")


def test_handler_bug_fails_the_job_at_once_as_a_handler_error(client: FarmClient):
    batch = client.submit([{"type": "tests.integration.test_e2e:BuggyEchoHandler", "config": {"text": "bug"}}])
    [result] = list(client.results(batch.id, wait_s=10))
    job = client.job(result.job.id)
    assert job.state is JobState.FAILED and job.outcome is Outcome.HANDLER_ERROR and job.reward is None
    assert "KeyError: 'a handler bug'" in (job.reason or "")
    assert [s.status for s in job.stages if s.stage is Stage.RUN] == [StageStatus.ERROR]  # a bug is not retried


class WrongStateEchoHandler(EchoHandler):
    """RUN hands on a state its EchoState refuses (a number where the target text goes)."""

    async def run(self, config, state, ctx):
        result = await super().run(config, state, ctx)
        return result.model_copy(update={"state": {"target": 5}})


def test_a_state_that_does_not_fit_fails_the_stage_that_hands_it_on(client: FarmClient):
    batch = client.submit([{"type": "tests.integration.test_e2e:WrongStateEchoHandler", "config": {"text": "x"}}])
    [result] = list(client.results(batch.id, wait_s=10))
    job = client.job(result.job.id)
    assert job.outcome is Outcome.HANDLER_ERROR and "ValidationError" in (job.reason or "")
    # Refused where RUN hands it on, not where EVAL reads it back.
    assert [s.status for s in job.stages if s.stage is Stage.RUN] == [StageStatus.ERROR]
    assert [s.stage for s in job.stages if s.stage is Stage.EVAL] == []


class StoreDownEchoHandler(EchoHandler):
    """An echo whose RUN meets the farm's database failing under it for its first ``fail_attempts``
    attempts (as a harness call's record would), wrapped in an error of the handler's own."""

    async def run(self, config, state, ctx):
        if ctx.attempt <= config.fail_attempts:
            try:
                raise OperationalError(
                    "INSERT INTO trial_calls ...", {}, ConnectionError("server closed the connection")
                )
            except OperationalError as exc:
                raise RuntimeError("could not record the call") from exc
        return await super().run(config, state, ctx)


def test_a_database_error_under_a_handler_is_retried_as_infrastructure_not_a_handler_bug(client: FarmClient):
    kind = "tests.integration.test_e2e:StoreDownEchoHandler"
    batch = client.submit(
        [
            {"type": kind, "config": {"text": "once", "fail_attempts": 1}},
            {"type": kind, "config": {"text": "always", "fail_attempts": 9}},
        ]
    )
    results = {r.job.id: r.job for r in client.results(batch.id, wait_s=10)}
    once, always = (client.job(job_id) for job_id in batch.job_ids)
    assert once.state is JobState.DONE and once.outcome is Outcome.OK
    assert [s.status for s in once.stages if s.stage is Stage.RUN] == [StageStatus.RETRY, StageStatus.OK]
    assert always.state is JobState.FAILED and always.outcome is Outcome.INFRA_ERROR and always.reward is None
    assert "the database failed during run: RuntimeError: could not record the call" in (always.reason or "")
    runs = [s.status for s in always.stages if s.stage is Stage.RUN]
    assert runs == [StageStatus.RETRY, StageStatus.RETRY, StageStatus.ERROR]
    assert len(results) == 2


def test_persistent_infrastructure_fault_fails_the_job_without_a_reward(client: FarmClient):
    batch = client.submit([echo("broken", fail_stage="eval", fail_attempts=10)])
    results = list(client.results(batch.id, wait_s=10))
    assert len(results) == 1
    job = results[0].job
    assert job.state is JobState.FAILED and job.outcome is Outcome.SANDBOX_ERROR
    assert job.reward is None and results[0].trajectory is None
    assert "simulated eval failure" in (job.reason or "")
    assert [s.status for s in client.job(job.id).stages if s.stage is Stage.EVAL] == [
        StageStatus.RETRY,
        StageStatus.RETRY,
        StageStatus.ERROR,
    ]


def test_cancel_stops_running_and_queued_jobs(client: FarmClient):
    # 12 jobs that would each hold a RUN slot for 60 s; 8 RUN slots, so some stay queued.
    batch = client.submit([echo("long", sleep_s={"run": 60})] * 12)
    wait_until(lambda: client.status(batch.id).counts[JobState.RUN] >= 4, timeout_s=30, what="jobs in RUN")

    status = client.cancel(batch.id)

    assert status.state is BatchState.CANCELLED
    assert status.counts[JobState.CANCELLED] == 12
    results = list(client.results(batch.id, wait_s=1))
    assert len(results) == 12 and all(r.job.outcome is Outcome.CANCELLED for r in results)
    # The RUN slots are free again: running stages noticed the cancel instead of sleeping on.
    quick = client.submit([echo("after cancel")] * 8)
    assert client.wait(quick.id, timeout_s=30).counts[JobState.DONE] == 8
    # Cancelling again is harmless.
    assert client.cancel(batch.id).state is BatchState.CANCELLED


def test_worker_killed_mid_stage_is_redelivered_and_job_ends_once(own_pg_url: str, make_stack):
    stack: EmbeddedStack = make_stack(database=own_pg_url)
    with FarmClient(stack.settings.api_url, token="e2e-token") as client:
        batch = client.submit([echo("survivor", sleep_s={"run": 3})])
        job_id = batch.job_ids[0]
        wait_until(
            lambda: any(s.stage is Stage.RUN and s.status is StageStatus.RUNNING for s in client.job(job_id).stages),
            timeout_s=30,
            what="RUN to start",
        )
        # Given a RUN stage in progress, when its worker is SIGKILLed (no chance to clean up)...
        run_worker = next(s for s in stack.services if s.name == "worker-run")
        os.killpg(run_worker.process.pid, signal.SIGKILL)
        run_worker.process.wait()
        # ...and a fresh worker comes up on the node,
        stack.spawn("worker-run-2", ["worker", "--queues", "run"])
        # then the stage is re-delivered and the job ends exactly once.
        results = list(client.results(batch.id, wait_s=10))
        assert len(results) == 1 and results[0].job.state is JobState.DONE
        runs = [(s.attempt, s.status) for s in client.job(job_id).stages if s.stage is Stage.RUN]
        assert runs == [(1, StageStatus.LOST), (2, StageStatus.OK)]
        assert client.status(batch.id).finished_jobs == 1
    engine = create_engine(own_pg_url)
    with engine.connect() as conn:
        assert conn.scalar(select(func.count()).select_from(Trajectory).where(Trajectory.job_id == job_id)) == 1
    engine.dispose()


def test_embedded_stack_runs_a_batch_on_valkey_and_sqlite(make_stack):
    stack: EmbeddedStack = make_stack(redis=None, database=None)
    assert stack.settings.database_url.startswith("sqlite")
    assert urlparse(stack.settings.redis.url).port != 6379  # its own Valkey, not the machine's Redis
    with FarmClient(stack.settings.api_url, token="e2e-token") as client:
        batch = client.submit([echo(f"embedded {i}", noise=0.2) for i in range(4)], group_size=2)
        results = list(client.results(batch.id, wait_s=10))
    assert len(results) == 8 and all(r.job.state is JobState.DONE for r in results)
    arrays = to_arrays(trajectories(results))
    assert arrays["input_ids"].shape[0] == 8 and (arrays["attention_mask"][:, 0] == 1).all()
