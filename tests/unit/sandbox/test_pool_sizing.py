"""Pool sizing and the node-wide creation-rate bucket (no sandboxes started)."""

from __future__ import annotations

from pathlib import Path

from farm.config import SandboxSettings
from farm.sandbox.pool import PoolSizing
from farm.sandbox.ratelimit import CreateRateLimit


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
