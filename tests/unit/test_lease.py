"""The per-process lease renewer: one UPDATE renews every stage it holds; lost leases show up
as a cancel to the running stage."""

from __future__ import annotations

import time
from datetime import timedelta
from typing import cast

from redis import Redis

from farm.config import Settings
from farm.constants import Stage
from farm.db import batches
from farm.db.base import utcnow
from farm.db.jobs import claims, lifecycle
from farm.db.models import Job
from farm.db.session import make_engine, make_session_factory, transaction
from farm.schemas import BatchCreate
from farm.worker.lease import LeaseRenewer


class _NoRedis:
    def exists(self, key: str) -> int:
        return 0


def _setup(sqlite_url: str):
    settings = Settings(database={"url": sqlite_url}, worker={"lease_s": 3.0})
    engine = make_engine(settings)
    sessions = make_session_factory(engine)
    request = BatchCreate(tasks=[{"type": "echo", "config": {"text": "x"}}], group_size=2)
    with transaction(sessions) as s:
        _, ids = batches.create_batch(s, request, idempotency_key=None, digest="d", now=utcnow(), owed_until=utcnow())
    for job_id in ids:
        with engine.begin() as conn:
            claims.claim_stage(
                conn, job_id=job_id, stage=Stage.INIT, node="n", worker="w", now=utcnow(), lease_s=3.0, max_attempts=3
            )
    renewer = LeaseRenewer(settings, engine=lambda: engine, redis_client=lambda: cast(Redis, _NoRedis()))
    return engine, sessions, renewer, ids


def test_renewer_extends_every_held_lease(sqlite_url):
    engine, sessions, renewer, (a, b) = _setup(sqlite_url)
    deadline = time.monotonic() + 60
    with renewer.hold(job_id=a, batch_id=1, stage=Stage.INIT, worker="w", deadline=deadline):
        with sessions() as s:
            before = s.get_one(Job, a).lease_until
        renewer.renew_once()
        with sessions() as s:
            assert s.get_one(Job, a).lease_until > before
            assert s.get_one(Job, b).lease_until <= before + timedelta(seconds=1)  # not held here
    engine.dispose()


def test_lost_lease_reads_as_cancelled(sqlite_url):
    engine, sessions, renewer, (a, _) = _setup(sqlite_url)
    with renewer.hold(job_id=a, batch_id=1, stage=Stage.INIT, worker="w", deadline=time.monotonic() + 60) as lease:
        assert not lease.is_cancelled()
        with transaction(sessions) as s:
            lifecycle.cancel_batch(s.connection(), batch_id=1, now=utcnow(), teardown_due=utcnow())
        renewer.renew_once()
        assert lease.lost and lease.is_cancelled()
    engine.dispose()


def test_stage_past_its_deadline_is_not_renewed(sqlite_url):
    engine, sessions, renewer, (a, _) = _setup(sqlite_url)
    with renewer.hold(job_id=a, batch_id=1, stage=Stage.INIT, worker="w", deadline=time.monotonic() - 10):
        with sessions() as s:
            before = s.get_one(Job, a).lease_until
        renewer.renew_once()
        with sessions() as s:
            assert s.get_one(Job, a).lease_until == before
    engine.dispose()


class _CountingRedis:
    def __init__(self) -> None:
        self.cancelled: set[str] = set()
        self.reads = 0

    def exists(self, key: str) -> int:
        self.reads += 1
        return int(key in self.cancelled)


def test_cancel_flag_is_read_once_per_batch_for_all_stages_of_the_process(sqlite_url, monkeypatch):
    from farm.constants import batch_cancel_key
    from farm.worker import lease as lease_module

    settings = Settings(database={"url": sqlite_url})
    fake = _CountingRedis()
    renewer = LeaseRenewer(settings, engine=lambda: None, redis_client=lambda: fake)  # type: ignore[arg-type,return-value]
    clock = [1000.0]
    monkeypatch.setattr("farm.worker.lease.time.monotonic", lambda: clock[0])
    with (
        renewer.hold(job_id=1, batch_id=7, stage=Stage.RUN, worker="w", deadline=2000.0) as first,
        renewer.hold(job_id=2, batch_id=7, stage=Stage.RUN, worker="w", deadline=2000.0) as second,
        renewer.hold(job_id=3, batch_id=8, stage=Stage.RUN, worker="w", deadline=2000.0) as other,
    ):
        assert not first.is_cancelled() and not second.is_cancelled() and not other.is_cancelled()
        assert fake.reads == 2  # one per batch
        fake.cancelled.add(batch_cancel_key(7))
        assert not second.is_cancelled()  # still within the cache window
        clock[0] += lease_module.CANCEL_CACHE_S
        assert first.is_cancelled() and second.is_cancelled()
        assert not other.is_cancelled()
        reads = fake.reads
        clock[0] += 10 * lease_module.CANCEL_CACHE_S
        assert first.is_cancelled() and fake.reads == reads  # a cancel is final: not read again
        assert not other.is_cancelled() and fake.reads == reads + 1
