"""Owed stages are sent again after their messages were lost, and only those: the reconciler
against the real Redis and PostgreSQL, then whole farms losing messages and Redis's data."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path

import pytest
import redis
from sqlalchemy import create_engine, func, select, update

from farm.client import FarmClient
from farm.config import Settings
from farm.constants import JobState, Outcome, Stage, epoch_key
from farm.db import batches, nodes
from farm.db.base import utcnow
from farm.db.jobs import claims, lifecycle
from farm.db.models import Job, Node, Teardown, Trajectory
from farm.db.session import transaction
from farm.embedded import EmbeddedStack
from farm.schemas import BatchCreate
from farm.worker.app import make_celery_app
from farm.worker.enqueue import send_init_many, send_stage
from farm.worker.queues import waiting_jobs
from farm.worker.reconciler import Reconciler
from farm.worker.sweeper import sweep_once
from tests.integration.conftest import wait_until

pytestmark = [pytest.mark.integration, pytest.mark.timeout(180)]


@pytest.fixture
def reconciler(tmp_path: Path, own_pg_url: str, redis_client) -> Iterator[Reconciler]:
    settings = Settings(
        data_dir=tmp_path,
        redis={"url": _url(redis_client)},
        database={"url": own_pg_url},
        worker={"node": "recon", "lease_s": 30.0},
    )
    app = make_celery_app(settings)
    yield Reconciler(app.farm, app)
    app.farm.close()


def _url(client: redis.Redis) -> str:
    kw = client.connection_pool.connection_kwargs
    return f"redis://{kw['host']}:{kw['port']}/{kw['db']}"


def _batch(reconciler: Reconciler, n: int) -> list[int]:
    request = BatchCreate(tasks=[{"type": "echo", "config": {"text": f"t{i}"}} for i in range(n)])
    now = utcnow()
    with transaction(reconciler._rt.sessions) as s:
        _, job_ids = batches.create_batch(
            s, request, idempotency_key=None, digest="d", now=now, owed_until=now - timedelta(seconds=1)
        )
    return job_ids


def _make_due(reconciler: Reconciler) -> None:
    with reconciler._rt.engine.begin() as conn:
        conn.execute(update(Job).values(lease_until=utcnow() - timedelta(seconds=1)))


def test_reconciler_sends_again_only_the_owed_messages_missing_from_their_queue(reconciler, redis_client):
    job_ids = _batch(reconciler, 6)
    # Given INIT messages for half the jobs waiting in the queue and the rest lost,
    send_init_many(reconciler._app, [(job_id, None) for job_id in job_ids[:3]])
    # when the reconciler runs, it sends the missing three and no copy of the waiting ones;
    assert reconciler.resend() == 3
    assert redis_client.llen("init") == 6 and waiting_jobs(redis_client, "init") == set(job_ids)
    # and their resend time moved on, so the next pass sends nothing,
    assert reconciler.resend() == 0
    # nor one at that time while the messages still wait.
    _make_due(reconciler)
    assert reconciler.resend() == 0 and redis_client.llen("init") == 6


def test_an_emptied_redis_is_noticed_once_and_everything_owed_is_sent_again(reconciler, redis_client):
    job_ids = _batch(reconciler, 4)
    with reconciler._rt.engine.begin() as conn:  # owed, but not yet due
        conn.execute(update(Job).values(lease_until=utcnow() + timedelta(seconds=20)))
    assert reconciler.redis_was_emptied() is True  # a fresh Redis: the first process takes the epoch
    assert reconciler.redis_was_emptied() is False
    assert reconciler.resend() == 0
    assert reconciler.resend(everything=True) == 4 and waiting_jobs(redis_client, "init") == set(job_ids)
    redis_client.flushdb()
    assert redis_client.get(epoch_key()) is None and reconciler.redis_was_emptied() is True


def _claim_init(reconciler: Reconciler, job_id: int, *, node: str, at) -> None:
    with reconciler._rt.engine.begin() as conn:
        claim = claims.claim_stage(
            conn, job_id=job_id, stage=Stage.INIT, node=node, worker=f"w@{node}", now=at, lease_s=30.0, max_attempts=3
        )
    assert claim.skip is None


def test_sweep_sends_a_stage_again_only_a_whole_lease_after_its_lease_lapsed(reconciler, redis_client):
    late, stalled = _batch(reconciler, 2)
    now = utcnow()
    # Given 30 s leases, one that lapsed 15 s ago (its renewer is merely late) and one 45 s ago,
    _claim_init(reconciler, late, node="n1", at=now - timedelta(seconds=45))
    _claim_init(reconciler, stalled, node="n1", at=now - timedelta(seconds=75))
    # the sweep sends only the second stage again.
    assert sweep_once(reconciler._rt, reconciler._app) == 1
    assert waiting_jobs(redis_client, "init") == {stalled}


def test_lost_nodes_are_judged_only_by_a_node_that_reported_throughout_the_bound(reconciler, redis_client):
    (job_id,) = _batch(reconciler, 1)
    now = utcnow()
    long_ago = now - 2 * timedelta(seconds=reconciler._rt.settings.worker.node_lost_s)
    # Given a job on a node silent for longer than node_lost_s,
    _claim_init(reconciler, job_id, node="gone", at=long_ago)
    with reconciler._rt.engine.begin() as conn:
        nodes.heartbeat(conn, "gone", now=long_ago, gap_since=long_ago)
    # a process whose own node has not reported (the database was away, say) judges no node lost,
    assert reconciler.hand_on_lost_nodes() == 0
    # nor does one whose node has reported for less than node_lost_s;
    reconciler.heartbeat()
    assert reconciler.hand_on_lost_nodes() == 0
    # one whose node has reported throughout starts the silent node's job over from INIT.
    with reconciler._rt.engine.begin() as conn:
        conn.execute(update(Node).where(Node.name == "recon").values(beating_since=long_ago))
    reconciler.heartbeat()
    assert reconciler.hand_on_lost_nodes() == 1
    assert waiting_jobs(redis_client, "init") == {job_id}


def test_an_owed_teardown_is_sent_again_only_when_no_message_for_it_waits(reconciler, redis_client):
    (job_id,) = _batch(reconciler, 1)
    _claim_init(reconciler, job_id, node="recon", at=utcnow())
    with reconciler._rt.engine.begin() as conn:
        batch_id = conn.scalar(select(Job.batch_id).where(Job.id == job_id))
        lifecycle.cancel_batch(conn, batch_id=batch_id, now=utcnow(), teardown_due=utcnow() - timedelta(seconds=1))
    # Given the teardown's RUN message still waiting on the job's node, nothing is sent again;
    send_stage(reconciler._app, job_id=job_id, stage=Stage.RUN, node="recon", task_id=None)
    assert reconciler.resend() == 0 and redis_client.llen("run.recon") == 1
    # once it is lost, it is.
    redis_client.delete("run.recon")
    with reconciler._rt.engine.begin() as conn:
        conn.execute(update(Teardown).values(due_at=utcnow() - timedelta(seconds=1)))
    assert reconciler.resend() == 1 and waiting_jobs(redis_client, "run.recon") == {job_id}


def _assert_each_job_ended_once(client: FarmClient, batch_id: int, job_ids: list[int], database_url: str) -> None:
    results = list(client.results(batch_id, wait_s=10))
    assert sorted(r.job.id for r in results) == sorted(job_ids), "each job once, none missing"
    assert [r.seq for r in results] == list(range(1, len(job_ids) + 1))
    assert all(r.job.state is JobState.DONE and r.job.outcome is Outcome.OK for r in results)
    engine = create_engine(database_url)
    with engine.connect() as conn:
        count = conn.scalar(select(func.count()).select_from(Trajectory).where(Trajectory.job_id.in_(job_ids)))
    engine.dispose()
    assert count == len(job_ids)


def echo(i: int) -> dict:
    return {"type": "echo", "config": {"text": f"owed {i}", "sleep_s": {"init": 0.3, "run": 1.0, "eval": 0.2}}}


def test_messages_lost_from_a_queue_are_sent_again_and_each_job_ends_once(own_pg_url: str, make_stack):
    stack: EmbeddedStack = make_stack(database=own_pg_url)
    client_redis = redis.Redis.from_url(stack.settings.redis_url)
    with FarmClient(stack.settings.api_url, token="e2e-token") as client:
        # Given a batch whose INIT messages back up behind 4 INIT slots,
        batch = client.submit([echo(i) for i in range(16)])
        # when the newest waiting messages vanish (a worker killed with them reserved, a crash
        # between a commit and its send), with Redis's epoch intact,
        lost = client_redis.lpop("init", 6) or []
        assert lost, "the INIT queue should have had messages waiting"
        # then the reconciler sends them again and every job ends exactly once.
        _assert_each_job_ended_once(client, batch.id, batch.job_ids, own_pg_url)
    client_redis.close()


def test_redis_emptied_mid_batch_loses_no_job(own_pg_url: str, make_stack):
    stack: EmbeddedStack = make_stack(database=own_pg_url)
    client_redis = redis.Redis.from_url(stack.settings.redis_url)
    with FarmClient(stack.settings.api_url, token="e2e-token") as client:
        batch = client.submit([echo(i) for i in range(12)])
        wait_until(lambda: client.status(batch.id).counts.get(JobState.RUN, 0) >= 2, timeout_s=60, what="jobs in RUN")
        # Given stages owed at every step (INITs waiting, RUNs running, EVALs about to be sent),
        # when Redis loses everything it held (a restart without persistence),
        client_redis.flushdb()
        # then each job still ends exactly once.
        _assert_each_job_ended_once(client, batch.id, batch.job_ids, own_pg_url)
    client_redis.close()


def test_teardowns_a_cancel_owes_are_paid_even_when_their_messages_were_lost(own_pg_url: str, make_stack):
    stack: EmbeddedStack = make_stack(database=own_pg_url, run_concurrency=1)
    client_redis = redis.Redis.from_url(stack.settings.redis_url)
    run_queue = f"run.{stack.settings.worker.node}"
    engine = create_engine(own_pg_url)

    def owed() -> int:
        with engine.connect() as conn:
            return conn.scalar(select(func.count()).select_from(Teardown)) or 0

    with FarmClient(stack.settings.api_url, token="e2e-token") as client:
        # Given jobs past INIT whose RUN messages wait behind one busy RUN slot,
        tasks = [{"type": "echo", "config": {"text": f"t{i}", "sleep_s": {"run": 2.0}}} for i in range(8)]
        batch = client.submit(tasks)
        wait_until(lambda: client_redis.llen(run_queue) >= 3, timeout_s=60, what="RUN messages waiting")
        # when the batch is cancelled and the waiting messages are lost,
        client.cancel(batch.id)
        assert owed() >= 3
        client_redis.delete(run_queue)
        # then the reconciler sends them to the node again, whose claims tear down and pay the debt.
        wait_until(lambda: owed() == 0, timeout_s=60, what="every owed teardown done")
    engine.dispose()
    client_redis.close()
