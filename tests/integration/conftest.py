"""A real farm for end-to-end tests: `farm api` and one `farm worker` per queue as child
processes, on the test PostgreSQL database and the test Redis database."""

from __future__ import annotations

import contextlib
import json
import socket
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from farm.client import FarmClient
from farm.config import Settings
from farm.constants import Stage
from farm.embedded import EmbeddedStack

pytestmark = pytest.mark.integration


#: handlers the tests define, allowed as task types by their paths (no request may name another).
TEST_HANDLER_PATHS = [
    "tests.integration.test_e2e:BuggyEchoHandler",
    "tests.integration.test_e2e:WrongStateEchoHandler",
    "tests.integration.test_e2e:StoreDownEchoHandler",
]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def stack_settings(
    data_dir: Path,
    *,
    redis_url: str | None,
    database_url: str | None,
    model_dir: Path | None = None,
    node: str = "testnode",
) -> Settings:
    """Settings for a farm under test. Farms that share the PostgreSQL database but not Redis must
    have distinct node names: a worker's lease sweeper re-sends a lapsed stage to its job's node."""
    return Settings(
        data_dir=data_dir,
        handler_paths=TEST_HANDLER_PATHS,
        redis={"url": redis_url},
        database={"url": database_url},
        api={"token": "e2e-token", "port": free_port()},
        llm={"builtin_port": free_port(), "builtin_model_dir": model_dir},
        proxy={"port": free_port()},
        worker={
            "node": node,
            "lease_s": 2.0,
            "sweep_interval_s": 0.5,
            "retry_delay_s": 0.2,
            "run_concurrency": 8,
            "init_concurrency": 4,
            "eval_concurrency": 2,
        },
    )


def side_redis_url(redis_url: str, offset: int) -> str:
    """The Redis database ``offset`` (0-3) past the test one, for a farm of a test's own. On a Redis
    with 64 databases or more they are 16 apart, so sessions that share one Redis with test databases
    0-15 never touch each other's (``redis-server --databases 64``); on 16, the next ones."""
    import redis

    base, _, db = redis_url.rpartition("/")
    client = redis.Redis.from_url(redis_url)
    try:
        count = int(client.config_get("databases").get("databases") or 16)
    except redis.RedisError:  # CONFIG may be disabled: assume the default
        count = 16
    finally:
        client.close()
    stride = count // 4 if count >= 64 else 1
    return f"{base}/{(int(db or 0) + offset * stride) % count}"


@contextlib.contextmanager
def scripted_stack(
    data_dir: Path,
    *,
    redis_url: str,
    redis_offset: int,
    database_url: str,
    model_dir: Path,
    node: str,
    rules: Any,
    stages: tuple[Stage, ...] | None = None,
    **llm: Any,
) -> Iterator[EmbeddedStack]:
    """A farm whose built-in backend answers by ``rules`` (scripted mode), on the Redis database
    ``redis_offset`` past the test one, flushed before and after. ``stages=()``: no workers (a test
    that only drives trials through the API's proxy starts three processes fewer)."""
    import redis

    url = side_redis_url(redis_url, redis_offset)
    redis.Redis.from_url(url).flushdb()
    script = data_dir / "script.json"
    script.write_text(json.dumps(rules))
    settings = stack_settings(data_dir, redis_url=url, database_url=database_url, model_dir=model_dir, node=node)
    settings = settings.model_copy(update={"llm": settings.llm.model_copy(update={"builtin_script": script, **llm})})
    stack = EmbeddedStack(settings, with_flower=False, with_llm=True)
    if stages is not None:
        stack.stages = stages
    stack.start()
    try:
        yield stack
    finally:
        stack.stop()
        redis.Redis.from_url(url).flushdb()


@pytest.fixture
def isolated_redis_url(redis_url: str) -> Iterator[str]:
    """The Redis database next to the test one, flushed: a farm here shares no queue with ``stack``."""
    import redis

    url = side_redis_url(redis_url, 1)
    client = redis.Redis.from_url(url)
    client.flushdb()
    yield url
    client.flushdb()
    client.close()


@pytest.fixture
def make_stack(tmp_path: Path, own_pg_url: str, isolated_redis_url: str) -> Iterator[Callable[..., EmbeddedStack]]:
    """Start farms of a test's own (a PostgreSQL database of the test's own and an isolated Redis
    database unless told otherwise)."""
    stacks: list[EmbeddedStack] = []

    def _make(
        *,
        redis: str | None = isolated_redis_url,
        database: str | None = own_pg_url,
        model_dir: Path | None = None,
        with_llm: bool = False,
        **worker: object,
    ) -> EmbeddedStack:
        settings = stack_settings(
            tmp_path / f"stack{len(stacks)}",
            redis_url=redis,
            database_url=database,
            model_dir=model_dir,
            node=f"isolated-{tmp_path.name}-{len(stacks)}",
        )
        if worker:
            settings = settings.model_copy(update={"worker": settings.worker.model_copy(update=worker)})
        stack = EmbeddedStack(settings, with_flower=False, with_llm=with_llm)
        stacks.append(stack)
        stack.start()
        return stack

    yield _make
    for stack in stacks:
        stack.stop()


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory, module_pg_url: str, redis_url: str) -> Iterator[EmbeddedStack]:
    """One farm shared by the tests of a module (each works in its own batches); tests that
    kill or reconfigure processes use ``make_stack`` for a farm of their own."""
    import redis

    client = redis.Redis.from_url(redis_url)
    client.flushdb()
    shared = EmbeddedStack(
        stack_settings(tmp_path_factory.mktemp("shared-stack"), redis_url=redis_url, database_url=module_pg_url),
        with_flower=False,
        with_llm=False,
    )
    shared.start()
    yield shared
    shared.stop()
    client.flushdb()
    client.close()


@pytest.fixture
def client(stack: EmbeddedStack) -> Iterator[FarmClient]:
    with FarmClient(stack.settings.api_url, token="e2e-token") as c:
        yield c


def wait_until(predicate: Callable[[], bool], *, timeout_s: float, what: str) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if predicate():
            return
        time.sleep(0.1)
    raise AssertionError(f"timed out after {timeout_s}s waiting for {what}")
