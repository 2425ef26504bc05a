"""The four task types through the real farm: INIT/RUN/EVAL workers on the real queues, real
sandboxes, the built-in backend over HTTP, trajectories read back through the client."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest

from farm.client import FarmClient
from farm.constants import POLICY_OUTCOMES, JobState
from farm.embedded import EmbeddedStack
from farm.sandbox import sandbox_root
from farm.sandbox.registry import Registry
from tasks.code.dataset import list_problems as code_problems
from tasks.math.dataset import list_problems as math_problems
from tests.integration.sandbox.conftest import require_bwrap

pytestmark = [pytest.mark.integration, pytest.mark.timeout(300)]


@pytest.fixture(scope="module")
def tasks_stack(
    tmp_path_factory: pytest.TempPathFactory, pg_url: str, redis_url: str, tiny_model_dir: Path
) -> Iterator[EmbeddedStack]:
    import redis

    from tests.integration.conftest import stack_settings

    require_bwrap()
    base, _, db = redis_url.rpartition("/")
    url = f"{base}/{(int(db) + 3) % 16}"
    redis.Redis.from_url(url).flushdb()
    settings = stack_settings(
        tmp_path_factory.mktemp("tasks-stack"),
        redis_url=url,
        database_url=pg_url,
        model_dir=tiny_model_dir,
        node="tasksnode",
    )
    stack = EmbeddedStack(settings, with_flower=False, with_llm=True)
    stack.start()
    yield stack
    stack.stop()
    redis.Redis.from_url(url).flushdb()


@pytest.fixture
def client(tasks_stack: EmbeddedStack) -> Iterator[FarmClient]:
    with FarmClient(tasks_stack.settings.api_url, token="e2e-token") as c:
        yield c


def mixed_tasks() -> list[dict[str, Any]]:
    return [
        {"type": "math", "config": {"problem_id": math_problems()[0].id}},
        {"type": "code", "config": {"problem_id": code_problems()[0].id, "max_turns": 2}},
        {"type": "swe", "config": {"instance_id": "rollout-farm__semver-1", "max_turns": 2}},
        {"type": "harbor", "config": {"example": "hello-file", "max_turns": 2}},
    ]


def test_every_task_type_end_to_end_on_the_tiny_model(
    client: FarmClient, tasks_stack: EmbeddedStack, teacher: Callable[[list[int]], Any]
) -> None:
    batch = client.submit(mixed_tasks(), group_size=2, sampling={"temperature": 1.0, "max_tokens": 40, "seed": 11})
    results = list(client.results(batch.id, wait_s=10, encoding="json"))
    assert len(results) == 8
    by_type: dict[str, int] = {}
    for r in results:
        # The random model solves nothing, but every episode is a scored policy outcome, never infra.
        assert r.job.state is JobState.DONE, (r.job.type, r.job.outcome, r.job.reason)
        assert r.job.outcome in POLICY_OUTCOMES
        assert r.trajectory is not None and r.trajectory.reward is not None and 0.0 <= r.trajectory.reward <= 1.0
        by_type[r.job.type] = by_type.get(r.job.type, 0) + 1
        t = r.trajectory
        info = t.info
        assert info["turns"] >= 1 and set(info["timings"]) >= {"model_s", "tools_s", "farm_s"}
        # Spans alternate: rendered prompt, model turn, new messages, model turn, ...
        bounds = [*t.turn_offsets, t.num_tokens]
        model = np.zeros(t.num_tokens, dtype=bool)
        for k in range(1, len(t.turn_offsets), 2):
            model[bounds[k] : bounds[k + 1]] = True
        assert np.array_equal(np.array(t.loss_mask, dtype=bool), model), "loss mask is 1 exactly on sampled ids"
        recomputed = np.asarray(teacher(t.token_ids))
        stored = np.asarray(t.logprobs)
        assert np.allclose(stored[model], recomputed[model], atol=1e-4), "stored logprobs match a teacher-forced pass"
        assert np.all(stored[~model] == 0.0)
    assert by_type == {"math": 2, "code": 2, "swe": 2, "harbor": 2}
    # Every sandbox (the agents' and EVAL's fresh ones) is gone once its job is done.
    assert Registry(root=sandbox_root(tasks_stack.settings)).records() == []


@pytest.mark.parametrize(
    ("task", "field"),
    [
        ({"type": "math", "config": {"problem_id": "nope"}}, "problem_id"),
        ({"type": "code", "config": {"problem_id": code_problems()[0].id, "reward": "most"}}, "reward"),
        ({"type": "swe", "config": {"instance_id": "nope"}}, "instance_id"),
        ({"type": "harbor", "config": {"example": "hello-file", "max_turns": 0}}, "max_turns"),
    ],
)
def test_bad_specs_are_refused_at_submit(tasks_stack: EmbeddedStack, task: dict[str, Any], field: str) -> None:
    response = httpx.post(
        f"{tasks_stack.settings.api_url}/v1/batches",
        json={"tasks": [task], "group_size": 1},
        headers={"Authorization": "Bearer e2e-token"},
    )
    assert response.status_code in (400, 422), response.text
    assert field in response.text
