"""A worker process's pools as ``farm.db.budget`` sizes them, on a real PostgreSQL, and a stage whose
claim and completion find no free connection: it waits, and spends no attempt (issue 29)."""

from __future__ import annotations

import logging
import threading
from collections.abc import Iterator

import pytest
from sqlalchemy import Connection, select

from farm.config import Settings
from farm.constants import Stage, StageStatus
from farm.db import batches
from farm.db.base import utcnow
from farm.db.models import Job, StageRun
from farm.db.session import transaction
from farm.schemas import BatchCreate
from farm.worker.app import FarmCelery, FarmRuntime, make_celery_app
from farm.worker.pipeline import execute_stage


@pytest.fixture
def app(pg_url: str, redis_url: str) -> Iterator[FarmCelery]:
    settings = Settings.model_validate(
        {"database": {"url": pg_url, "pool_timeout_s": 0.2}, "redis": {"url": redis_url}, "worker": {"node": "budget"}}
    )
    app = make_celery_app(settings)
    yield app
    app.farm.close()
    app.close()


@pytest.fixture
def runtime(app: FarmCelery) -> FarmRuntime:
    return app.farm


def test_a_worker_pools_follow_its_slots_and_finishing_completions_share_the_main_pool(runtime: FarmRuntime):
    pools = runtime.size_pools(32, name="farm-worker-run@budget")
    assert dict(pools.pools) == {"main": 2, "claims": 1} and pools.total == 3
    claims, durable = runtime.autocommit(), runtime.autocommit(durable=True)
    assert claims is not None and durable is not None
    assert durable.pool is runtime.engine.pool and claims.pool is not runtime.engine.pool
    assert runtime.engine.pool.size() == 2 and claims.pool.size() == 1  # type: ignore[attr-defined]
    with durable.connect() as conn:
        name = conn.exec_driver_sql("select current_setting('application_name')").scalar_one()
    assert name == "farm-worker-run@budget"


def _batch(runtime: FarmRuntime, init_sleep_s: float) -> int:
    request = BatchCreate(tasks=[{"type": "echo", "config": {"text": "t", "sleep_s": {"init": init_sleep_s}}}])
    with transaction(runtime.sessions) as s:
        now = utcnow()
        _, [job_id] = batches.create_batch(
            s, request, idempotency_key=None, digest=batches.request_hash(request), now=now, owed_until=now
        )
    return job_id


@pytest.mark.parametrize(("step", "taken_at_s", "init_sleep_s"), [("claim", 0.0, 0.0), ("completion", 0.3, 1.0)])
def test_a_stage_that_finds_no_free_connection_waits_and_spends_no_attempt(
    app: FarmCelery, runtime: FarmRuntime, caplog, step: str, taken_at_s: float, init_sleep_s: float
):
    runtime.size_pools(4, name="farm-worker-all@budget")
    job_id = _batch(runtime, init_sleep_s)
    claims = runtime.autocommit()
    assert claims is not None
    with claims.connect():
        pass  # opened now, so that taking it later is quick
    # The claims pool's one connection is taken (a burst of other stages' statements) before the
    # claim, or while INIT runs (so its completion finds none), and given back 1.5 s later.
    held: list[Connection] = []
    taken = threading.Event()

    def take() -> None:
        held.append(claims.connect())
        taken.set()
        threading.Timer(1.5, held[0].close).start()

    threading.Timer(taken_at_s, take).start() if taken_at_s else take()
    with caplog.at_level(logging.WARNING, logger="farm.worker.pipeline"):
        report = execute_stage(runtime, app, Stage.INIT, job_id, worker="budget:1")
    assert taken.is_set()
    assert report.action == "completed", report
    waits = [r.getMessage() for r in caplog.records if "the database is unavailable" in r.getMessage()]
    assert waits and all(w.startswith(f"job {job_id} init: {step}") for w in waits), waits
    with transaction(runtime.sessions) as session:
        job = session.get(Job, job_id)
        assert job is not None and job.stage_attempts == 1 and job.attempts == 1
        runs = session.scalars(select(StageRun.status).where(StageRun.job_id == job_id)).all()
    assert list(runs) == [StageStatus.OK]
