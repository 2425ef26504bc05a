"""Fixtures of the crash tests: a PostgreSQL cluster for the session (each test gets a database of
its own there), a Redis per test, and farms of real processes that are all gone after the test."""

from __future__ import annotations

import shutil
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from farm.testing import temporary_database
from tests.conftest import service_missing
from tests.crash.harness import Farm, PrivatePostgres, PrivateRedis


@pytest.fixture(scope="session")
def pg_server() -> Iterator[PrivatePostgres]:
    """A private cluster: tests stop it (`pg_ctl stop -m immediate`) without touching the shared one."""
    if shutil.which("redis-server") is None:
        service_missing("redis-server (apt-get install redis-server)", FileNotFoundError("redis-server"))
    server = PrivatePostgres()
    try:
        server.init()
    except (FileNotFoundError, OSError) as exc:
        service_missing("a private PostgreSQL cluster (apt-get install postgresql)", exc)
    yield server
    leftovers = server.destroy()
    assert not leftovers, f"left running: {leftovers}"


@pytest.fixture
def crash_db(pg_server: PrivatePostgres) -> Iterator[str]:
    """An empty database on the private cluster; the farm migrates it with `farm migrate`."""
    with temporary_database(pg_server.url, prefix="farm_crash", migrated=False) as url:
        yield url


@pytest.fixture
def crash_redis(tmp_path: Path) -> Iterator[PrivateRedis]:
    server = PrivateRedis(log_path=tmp_path / "redis.log")
    server.start()
    yield server
    leftovers = server.stop()
    assert not leftovers, f"left running: {leftovers}"


@pytest.fixture
def make_farm(tmp_path: Path, crash_db: str, crash_redis: PrivateRedis) -> Iterator[Callable[..., Farm]]:
    """``make_farm(nodes=[...], **worker_settings)``: the farm is stopped after the test, and the
    test fails if any of its processes survives that."""
    farms: list[Farm] = []

    def _make(*, nodes: list[str], model_dir: Path | None = None, **worker: Any) -> Farm:
        farm = Farm.create(
            tmp_path / "farm",
            nodes=nodes,
            redis_url=crash_redis.url,
            database_url=crash_db,
            model_dir=model_dir,
            **worker,
        )
        farms.append(farm)
        return farm

    yield _make
    leftovers = [left for farm in farms for left in farm.stop()]
    assert not leftovers, f"left running after the test: {leftovers}"
