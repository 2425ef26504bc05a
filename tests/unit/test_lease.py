"""The per-process lease renewer: one UPDATE renews every stage it holds; lost leases show up
as a cancel to the running stage."""

from __future__ import annotations

import time
from datetime import timedelta

from farm.config import Settings
from farm.constants import Stage
from farm.db import lifecycle, queries
from farm.db.base import utcnow
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
        _, ids = queries.create_batch(s, request, idempotency_key=None, digest="d", now=utcnow())
    for job_id in ids:
        with engine.begin() as conn:
            lifecycle.claim_stage(
                conn, job_id=job_id, stage=Stage.INIT, node="n", worker="w", now=utcnow(), lease_s=3.0, max_attempts=3
            )
    renewer = LeaseRenewer(settings, engine=lambda: engine, redis_client=lambda: _NoRedis())
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
            lifecycle.cancel_batch(s.connection(), batch_id=1, now=utcnow())
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
