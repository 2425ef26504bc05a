"""Shared bench plumbing: fresh databases on this machine's PostgreSQL, a flushed Redis
database, free ports, and the one JSON line every benchmark ends with."""

from __future__ import annotations

import contextlib
import json
import os
import socket
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import redis

from farm.config import Settings
from farm.testing import temporary_database

POSTGRES = os.environ.get("FARM_BENCH_DATABASE_URL", "postgresql+psycopg://postgres@127.0.0.1:5432/postgres")
REDIS = os.environ.get("FARM_BENCH_REDIS_URL", "redis://127.0.0.1:6379/10")


def fresh_database() -> contextlib.AbstractContextManager[str]:
    """A new PostgreSQL database migrated to head, dropped afterwards."""
    return temporary_database(POSTGRES, prefix="farm_bench")


def stack_settings(data_dir: Path, *, redis_url: str, database_url: str, concurrency: dict[str, int]) -> Settings:
    """Settings for a benchmark's farm: its own token, a free port, the given pool sizes."""
    return Settings(
        data_dir=data_dir,
        redis={"url": redis_url},
        database={"url": database_url},
        api={"token": "bench", "port": free_port()},
        proxy={"port": free_port()},
        worker={"node": "bench", **{f"{stage}_concurrency": n for stage, n in concurrency.items()}},
    )


@contextlib.contextmanager
def flushed_redis(url: str = REDIS) -> Iterator[str]:
    client = redis.Redis.from_url(url)
    client.flushdb()
    try:
        yield url
    finally:
        client.flushdb()
        client.close()


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def emit(figures: dict[str, Any]) -> None:
    """The last line of every benchmark's output: its figures as one JSON object."""
    print(json.dumps(figures, sort_keys=False))
