"""The farm behind PgBouncer in transaction mode (Debian's 1.18: no prepared statements across
transactions, no startup options), as docs/operations.md, "PgBouncer", sets it up.

The fast tests show what breaks through it with ``database.prepared_statements`` and
``database.startup_options`` on (the defaults, right for a direct PostgreSQL) and that both off
work. The slow one (``--run-pgbouncer``) runs a real farm through it end to end: migrations, the
API, Celery workers on the three queues, the built-in backend, the proxy's recorder (harness jobs),
every job done, on fewer server connections than the farm's processes hold client connections.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest
import redis
import sqlalchemy as sa

from farm.client import FarmClient
from farm.config import Settings
from farm.constants import JobState
from farm.db.session import libpq_url, make_autocommit_engine, make_engine
from farm.embedded import EmbeddedStack
from farm.testing import temporary_database
from farm.testing.pgbouncer import PgBouncer, pgbouncer_binary, private_pgbouncer
from farm.trials.async_statements import AsyncTrials
from tasks.math.dataset import list_problems as math_problems
from tests.conftest import service_missing
from tests.integration.conftest import side_redis_url, stack_settings
from tests.integration.proxy.test_harness_task import HARNESS

pytestmark = [pytest.mark.integration, pytest.mark.timeout(300)]

#: server connections PgBouncer keeps per database: fewer than the farm below opens as a client.
SERVER_POOL = 4
#: echo jobs: every claim and completion statement runs far more often than psycopg's threshold.
ECHO_JOBS = 40
MATH = {"type": "math", "config": {"problem_id": math_problems()[0].id}}


@pytest.fixture(scope="module")
def bouncer(postgres_url: str) -> Iterator[PgBouncer]:
    if pgbouncer_binary() is None:
        service_missing("pgbouncer (apt-get install pgbouncer)", FileNotFoundError("pgbouncer"))
    with private_pgbouncer(postgres_url, pool_size=SERVER_POOL) as running:
        yield running


@pytest.fixture
def bounced_db(postgres_url: str, bouncer: PgBouncer) -> Iterator[tuple[str, str]]:
    """A migrated database of the test's own: (its URL on the server, the same through PgBouncer)."""
    with temporary_database(postgres_url, prefix="farm_bouncer") as url:
        yield url, bouncer.url_of(url)


def behind_pgbouncer(url: str, *, on: bool) -> Settings:
    return Settings(database={"url": url, "prepared_statements": on, "startup_options": on})


def test_prepared_statements_break_through_pgbouncer_unless_off(bounced_db: tuple[str, str]) -> None:
    _, url = bounced_db
    for on in (True, False):
        engine = make_engine(behind_pgbouncer(url, on=on)).execution_options(isolation_level="AUTOCOMMIT")
        other = psycopg.connect(libpq_url(url), autocommit=True)
        try:
            with engine.connect() as conn:
                # Each statement its own transaction: PgBouncer hands back the connection it just
                # used (LIFO), and psycopg prepares the statement there at its 6th execution.
                for i in range(6):
                    conn.execute(sa.text("select count(*) + :i from jobs"), {"i": i})
                with other.transaction():
                    other.execute("select 1")  # holds that server connection until the block ends
                    if on:
                        with pytest.raises(sa.exc.DBAPIError, match=r'prepared statement "_pg3_\d+" does not exist'):
                            conn.execute(sa.text("select count(*) + :i from jobs"), {"i": 7})
                    else:
                        assert conn.execute(sa.text("select count(*) + :i from jobs"), {"i": 7}).scalar() == 7
        finally:
            other.close()
            engine.dispose()


def test_startup_options_are_refused_by_pgbouncer_unless_off(bounced_db: tuple[str, str]) -> None:
    _, url = bounced_db
    refused = make_autocommit_engine(behind_pgbouncer(url, on=True), durable=False)
    assert refused is not None
    with pytest.raises(sa.exc.OperationalError, match="unsupported startup parameter: options"), refused.connect():
        pass
    refused.dispose()
    early = make_autocommit_engine(behind_pgbouncer(url, on=False), durable=False)
    assert early is not None
    with early.connect() as conn:
        # The cost of going without: those commits wait for the disk like every other.
        assert conn.execute(sa.text("show synchronous_commit")).scalar() == "on"
    early.dispose()


def test_the_proxy_recorders_statements_work_through_pgbouncer_only_unprepared(bounced_db: tuple[str, str]) -> None:
    """The recorder's async pools prepare their statements at once unless told not to."""
    _, url = bounced_db
    hashes = [bytes([n]) * 16 for n in range(3)]
    for on in (True, False):
        loop = asyncio.new_event_loop()
        trials = AsyncTrials(url, max_size=1, prepared_statements=on, startup_options=False)
        other = psycopg.connect(libpq_url(url), autocommit=True)
        try:
            assert loop.run_until_complete(trials.here()) is trials
            assert loop.run_until_complete(trials.find_parent("no-such-trial", hashes)) is None
            with other.transaction():
                other.execute("select 1")  # holds the server connection the first call used
                if on:
                    with pytest.raises(psycopg.errors.InvalidSqlStatementName):
                        loop.run_until_complete(trials.find_parent("no-such-trial", hashes))
                else:
                    assert loop.run_until_complete(trials.find_parent("no-such-trial", hashes)) is None
        finally:
            other.close()
            loop.run_until_complete(trials.close())
            loop.close()


def echo(i: int) -> dict[str, Any]:
    return {"type": "echo", "config": {"text": f"bounced {i}", "sleep_s": {"init": 0.02, "run": 0.05, "eval": 0.02}}}


def harness() -> dict[str, Any]:
    config = {
        "task": {"type": "harbor", "config": {"example": "hello-file"}},
        "harness": {"preset": "command", "command": ["python3", "-c", HARNESS]},
    }
    return {"type": "harness", "config": config}


class PeakConnections:
    """The most server connections to ``database`` and client connections PgBouncer held for it,
    sampled on a thread while the batch runs."""

    def __init__(self, bouncer: PgBouncer, database: str) -> None:
        self.servers = self.clients = 0
        self._bouncer, self._database = bouncer, database
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._sample, name="peak-connections", daemon=True)
        self._thread.start()

    def _sample(self) -> None:
        while not self._stop.wait(0.2):
            pools = [p for p in self._bouncer.show("POOLS") if p["database"] == self._database]
            in_use = sum(int(p[k]) for p in pools for k in ("sv_active", "sv_idle", "sv_used", "sv_tested", "sv_login"))
            clients = sum(int(p[k]) for p in pools for k in ("cl_active", "cl_waiting"))
            self.servers, self.clients = max(self.servers, in_use), max(self.clients, clients)

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(10)


@pytest.mark.pgbouncer
def test_a_mixed_batch_runs_end_to_end_through_pgbouncer(
    tmp_path: Path, bounced_db: tuple[str, str], bouncer: PgBouncer, redis_url: str, tiny_model_dir: Path
) -> None:
    server_url, url = bounced_db
    redis_db = side_redis_url(redis_url, 2)
    redis.Redis.from_url(redis_db).flushdb()
    settings = stack_settings(tmp_path, redis_url=redis_db, database_url=url, model_dir=tiny_model_dir, node="bounced")
    behind = {"prepared_statements": False, "startup_options": False}
    settings = settings.model_copy(update={"database": settings.database.model_copy(update=behind)})
    peak = PeakConnections(bouncer, str(sa.make_url(server_url).database))
    # API, three Celery workers, the built-in backend; migrations and the backend's registration too.
    with EmbeddedStack(settings, with_flower=False, with_llm=True) as stack:
        with FarmClient(stack.settings.api_url, token="e2e-token") as client:
            tasks = [echo(i) for i in range(ECHO_JOBS)] + [MATH] * 2 + [harness()] * 2
            batch = client.submit(tasks, sampling={"temperature": 1.0, "max_tokens": 16})
            results = list(client.results(batch.id, wait_s=10, encoding="json"))
            overview = client.overview()
    peak.stop()
    redis.Redis.from_url(redis_db).flushdb()
    assert len(results) == len(tasks)
    not_done = [(r.job.type, r.job.state, r.job.outcome, r.job.reason) for r in results if r.job.state != JobState.DONE]
    assert not not_done, not_done
    by_type = {t: sum(r.job.type == t for r in results) for t in ("echo", "math", "harness")}
    assert by_type == {"echo": ECHO_JOBS, "math": 2, "harness": 2}
    # The harness's calls were recorded through the proxy's async pools: its trajectory is the record.
    for r in results:
        if r.job.type == "harness":
            assert r.job.outcome == "ok" and r.job.reward == 1.0, r.job.reason
            assert r.trajectory is not None and r.trajectory.info.get("calls", 2) >= 1
    # Transaction pooling: the farm's processes held more client connections than PgBouncer gave
    # them server connections.
    assert peak.servers <= SERVER_POOL < peak.clients, (peak.servers, peak.clients)
    print(f"PGBOUNCER jobs={len(results)} server_connections_max={peak.servers} client_connections_max={peak.clients}")
    # `farm status` reads the server through it too (the server's count, not the farm's clients).
    assert overview.database is not None and overview.database.max_connections > 0
