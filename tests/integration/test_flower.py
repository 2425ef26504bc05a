"""Flower on a running farm, opened in a real headless Chromium: the Workers, Tasks and Broker
pages show the farm's pools, stage tasks and queues (the DOM after the pages' own scripts ran,
and a screenshot of each)."""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from farm.client import FarmClient
from farm.embedded import EmbeddedStack
from tests.browser import browse, chromium
from tests.integration.conftest import free_port, stack_settings, wait_until

pytestmark = [pytest.mark.integration, pytest.mark.slow, pytest.mark.timeout(240)]

NODE = "flowernode"


@pytest.fixture(scope="module")
def flower_stack(
    tmp_path_factory: pytest.TempPathFactory, module_pg_url: str, redis_url: str
) -> Iterator[EmbeddedStack]:
    import redis

    chromium()
    client = redis.Redis.from_url(redis_url)
    client.flushdb()
    settings = stack_settings(
        tmp_path_factory.mktemp("flower-stack"), redis_url=redis_url, database_url=module_pg_url, node=NODE
    )
    settings = settings.model_copy(update={"flower": settings.flower.model_copy(update={"port": free_port()})})
    stack = EmbeddedStack(settings, with_flower=True, with_llm=False)
    stack.start()
    yield stack
    stack.stop()
    client.flushdb()
    client.close()


def test_flower_shows_the_pools_the_stage_tasks_and_the_queues(flower_stack: EmbeddedStack, tmp_path: Path):
    flower = f"http://127.0.0.1:{flower_stack.settings.flower.port}"
    wait_until(lambda: _answers(f"{flower}/healthcheck"), timeout_s=60, what="Flower")

    # Flower switches the workers' task events on every few seconds after it starts: batches are
    # sent until it has seen one whole.
    def saw_a_batch() -> bool:
        with FarmClient(flower_stack.settings.api_url, token="e2e-token") as client:
            batch = client.submit([{"type": "echo", "config": {"text": "flower"}}], group_size=2)
            assert len(list(client.results(batch.id, wait_s=10, encoding="json"))) == 2
        tasks = httpx.get(f"{flower}/api/tasks", timeout=10).json()
        return any(t["name"] == "farm.stage.eval" and t["state"] == "SUCCESS" for t in tasks.values())

    wait_until(saw_a_batch, timeout_s=90, what="Flower to see a batch's stage tasks")

    workers = browse(
        f"{flower}/workers",
        screenshot=tmp_path / "workers.png",
        until=lambda dom: all(f"{pool}@{NODE}" in dom for pool in ("init", "run", "eval")),
    )
    for pool in ("init", "run", "eval"):
        assert f"{pool}@{NODE}" in workers, f"no {pool} worker on the Workers page"

    tasks = browse(
        f"{flower}/tasks",
        screenshot=tmp_path / "tasks.png",
        until=lambda dom: "farm.stage.init" in dom and "farm.stage.eval" in dom,
    )
    assert "farm.stage.init" in tasks and "farm.stage.eval" in tasks
    # Each stage task shows its job (args) and its result names the task type and what happened.
    assert re.search(r"<td[^>]*>\[\d+\]</td>", tasks), "no job id in the task rows"
    assert "&#39;type&#39;: &#39;echo&#39;" in tasks or "'type': 'echo'" in tasks, "task results name the task type"

    # Flower names the queues the workers said they consume (its periodic inspect of each worker).
    queues = ("init", f"run.{NODE}", f"eval.{NODE}")
    wait_until(
        lambda: all(f">{q}<" in httpx.get(f"{flower}/broker", timeout=10).text for q in queues),
        timeout_s=60,
        what="Flower's Broker page to list the farm's queues",
    )
    broker = browse(f"{flower}/broker", screenshot=tmp_path / "broker.png")
    assert "is not supported" not in broker
    for queue in queues:
        assert f">{queue}<" in broker.replace(" ", ""), f"queue {queue} missing from the Broker page"


def _answers(url: str) -> bool:
    try:
        return httpx.get(url, timeout=2).status_code == 200
    except httpx.HTTPError:
        return False
