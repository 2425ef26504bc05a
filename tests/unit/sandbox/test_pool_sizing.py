"""Pool sizing and shapes, and the node-wide creation-rate bucket (no sandboxes started)."""

from __future__ import annotations

from pathlib import Path

from farm.config import SandboxSettings
from farm.sandbox.base import SandboxSpec
from farm.sandbox.pool import PoolSizing, WarmPool, pool_key
from farm.sandbox.ratelimit import CreateRateLimit
from farm.sandbox.server_sandbox import ServerSandbox


def test_pool_target_follows_the_queue_within_min_and_size() -> None:
    sizing = PoolSizing.of(SandboxSettings(pool_size=8, pool_min=2))
    assert sizing.target(None) == 8  # the queue's length unknown: full size
    assert sizing.target(0) == 2
    assert sizing.target(5) == 5
    assert sizing.target(50) == 8
    assert PoolSizing.of(SandboxSettings(pool_size=1, pool_min=3)).target(0) == 1


def test_create_rate_limit_allows_a_burst_then_waits(tmp_path: Path) -> None:
    limit = CreateRateLimit(tmp_path, rate=0.01, burst=2)
    assert limit._try_take() == 0 and limit._try_take() == 0
    assert limit._try_take() > 50  # one token per 100 s: the third waits
    # Another process's limiter on the node reads the same bucket
    assert CreateRateLimit(tmp_path, rate=0.01, burst=2)._try_take() > 50


def test_create_rate_limit_off_never_waits(tmp_path: Path) -> None:
    limit = CreateRateLimit(tmp_path, rate=0, burst=1)
    assert [limit.acquire() for _ in range(5)] == [0.0] * 5
    assert not (tmp_path / "create-rate").exists()


def test_pool_warms_only_its_own_drivers_shapes(tmp_path: Path) -> None:
    def never(_: object) -> ServerSandbox:
        raise AssertionError("nothing is started here")

    pools = {
        driver: WarmPool(root=tmp_path, driver=driver, settings=SandboxSettings(), create=never, attach=never)
        for driver in ("bwrap", "docker")
    }
    # Given both drivers' callers asked for the same spec on one node
    for pool in pools.values():
        assert pool.take(SandboxSpec()) is None
    # Then each pool sees one shape: its own driver's
    assert [k.name for k in pools["bwrap"]._shapes()] == [pool_key(SandboxSpec(), "bwrap")]
    assert [k.name for k in pools["docker"]._shapes()] == [pool_key(SandboxSpec(), "docker")]
