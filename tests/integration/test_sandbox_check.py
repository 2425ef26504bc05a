"""A worker whose sandbox driver cannot work refuses to start, and /readyz says why."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from farm.constants import sandbox_checks_key
from farm.embedded import EmbeddedStack, settings_env
from tests.integration.conftest import stack_settings

pytestmark = [pytest.mark.integration, pytest.mark.timeout(120)]


def _broken_settings(tmp_path: Path, redis_url: str, database_url: str):
    settings = stack_settings(tmp_path, redis_url=redis_url, database_url=database_url, node="nobwrap")
    sandbox = settings.sandbox.model_copy(update={"bwrap_path": str(tmp_path / "no-such-bwrap")})
    return settings.model_copy(update={"sandbox": sandbox})


def test_worker_without_a_working_sandbox_driver_exits_at_start_saying_why(
    tmp_path: Path, own_pg_url: str, isolated_redis_url: str, redis_client
):
    settings = _broken_settings(tmp_path, isolated_redis_url, own_pg_url)
    env = {**{k: v for k, v in os.environ.items() if not k.startswith("FARM_")}, **settings_env(settings)}
    done = subprocess.run(
        [sys.executable, "-m", "farm", "worker", "--queues", "init"],
        env=env,
        capture_output=True,
        text=True,
        timeout=90,
    )
    assert done.returncode != 0
    assert "sandbox driver 'bwrap' cannot start a sandbox" in done.stderr
    assert "apt-get install bubblewrap" in done.stderr and "FARM_SANDBOX__DRIVER" in done.stderr


def test_farm_up_stops_with_the_workers_reason(tmp_path: Path, own_pg_url: str, isolated_redis_url: str):
    import redis

    settings = _broken_settings(tmp_path, isolated_redis_url, own_pg_url)
    stack = EmbeddedStack(settings, with_flower=False, with_llm=False)
    with pytest.raises(RuntimeError, match="cannot start a sandbox"):
        stack.start()
    # The failed check is left where the API's /readyz reads it.
    client = redis.Redis.from_url(isolated_redis_url)
    raw = client.hget(sandbox_checks_key(), "nobwrap")
    assert raw is not None
    record = json.loads(raw)
    assert record["ok"] is False and "bubblewrap" in record["detail"]
    client.close()


def test_readyz_shows_a_nodes_failed_sandbox_check(tmp_path: Path, pg_url: str, redis_url: str, redis_client):
    from fastapi.testclient import TestClient

    from farm.api.app import create_app
    from farm.config import Settings

    redis_client.hset(
        sandbox_checks_key(),
        "gpu-node-3",
        json.dumps({"ok": False, "detail": "sandbox driver 'bwrap' cannot start a sandbox: ...", "at": time.time()}),
    )
    redis_client.hset(sandbox_checks_key(), "old-node", json.dumps({"ok": False, "detail": "stale", "at": 0}))
    settings = Settings(data_dir=tmp_path, database={"url": pg_url}, redis={"url": redis_url}, api={"token": "t"})
    with TestClient(create_app(settings)) as api:
        answer = api.get("/readyz")
    assert answer.status_code == 503
    checks = answer.json()["checks"]
    assert checks["sandbox@gpu-node-3"].startswith("sandbox driver 'bwrap' cannot start")
    assert "sandbox@old-node" not in checks and checks["database"] == checks["redis"] == "ok"
