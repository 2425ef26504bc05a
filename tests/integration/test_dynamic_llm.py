"""A dynamic batch's early stop really stops: the model requests of the stopped jobs are aborted on
the backend and their balancer slots released, seconds before those turns would have ended.

The built-in backend decodes one step per 20 ms: a 400-token turn takes about 8 s, an 8-token one a
fraction of a second. The quick prompt's group is informative first (two random replies score
different vowel shares), and the slow groups are stopped mid-decode."""

from __future__ import annotations

import re
import time
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import httpx
import pytest

from farm.client import FarmClient
from farm.constants import BatchState, JobState
from farm.embedded import EmbeddedStack
from tests.integration.conftest import scripted_stack

pytestmark = [pytest.mark.integration, pytest.mark.timeout(240)]


def generate(text: str, max_tokens: int) -> dict[str, Any]:
    config = {"messages": [{"role": "user", "content": text}], "reference": "aeiou", "match": "charset"}
    return {"type": "generate", "config": {**config, "max_tokens": max_tokens}}


@pytest.fixture(scope="module")
def slow_stack(
    tmp_path_factory: pytest.TempPathFactory, module_pg_url: str, redis_url: str, tiny_model_dir: Path
) -> Iterator[EmbeddedStack]:
    with scripted_stack(
        tmp_path_factory.mktemp("dynamic-llm"),
        redis_url=redis_url,
        redis_offset=1,
        database_url=module_pg_url,
        model_dir=tiny_model_dir,
        node="dynllm",
        rules={"rules": []},
        builtin_step_time_ms=20.0,
    ) as stack:
        yield stack


def metric(url: str, name: str) -> int:
    found = re.search(rf"^{name}\S* (\S+)$", httpx.get(f"{url}/metrics").text, re.M)
    assert found is not None, name
    return int(float(found.group(1)))


def test_stopped_jobs_abort_their_model_requests_and_release_their_slots(slow_stack: EmbeddedStack):
    tasks = [generate("quick", 8), *(generate(f"slow {i}", 400) for i in range(3))]
    with FarmClient(slow_stack.settings.api_url, token="e2e-token") as farm:
        batch = farm.submit(
            tasks, group_size=2, sampling={"seed": 5}, dynamic={"target_groups": 1, "max_groups_in_flight": 4}
        )
        (group,) = list(farm.groups(batch.id, wait_s=30))
        stopped_at, stopped_wall = time.monotonic(), datetime.now(UTC)
        assert group.index == 0

        url = slow_stack.builtin_url
        while metric(url, "vllm:num_requests_running") and time.monotonic() - stopped_at < 5:
            time.sleep(0.05)
        aborted_after = time.monotonic() - stopped_at
        decoded = metric(url, "vllm:generation_tokens_total")
        time.sleep(0.5)
        assert metric(url, "vllm:generation_tokens_total") == decoded, "nothing decodes for stopped jobs"
        assert aborted_after < 5, "the slow turns (8 s each) were aborted, not finished"

        status = farm.status(batch.id)
        assert status.state is BatchState.COMPLETE and status.dynamic is not None
        assert status.dynamic.end_reason == "target_reached"
        jobs = [farm.job(job_id) for job_id in range(min(batch.job_ids), min(batch.job_ids) + 8)]
        slow = [j for j in jobs if j.batch_id == batch.id and j.group_index > 0]
        ended = [(j.id, j.group_index, j.state.value, j.reason, j.finished_at) for j in slow]
        # The tiny model may sample its end of text early: such a slow job ended by itself, before
        # the stop. Every one still running at the stop was cancelled for it.
        by_itself = [j for j in slow if j.state is JobState.DONE and j.finished_at and j.finished_at <= stopped_wall]
        stopped = [j for j in slow if j not in by_itself]
        assert stopped and all(j.state is JobState.CANCELLED and j.reason == "target_reached" for j in stopped), ended
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            backends = httpx.get(
                f"{slow_stack.settings.api_url}/v1/backends", headers={"Authorization": "Bearer e2e-token"}
            ).json()
            if all(b["inflight"] == 0 for b in backends):
                break
            time.sleep(0.1)
        assert all(b["inflight"] == 0 for b in backends), "the stopped jobs gave their backend slots back"
