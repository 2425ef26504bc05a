"""A group of 8 samples of one swe task through a real farm (INIT, RUN and EVAL workers, the
scripted built-in backend over HTTP, bwrap sandboxes): the task's setup runs once on the node,
every sample works in its own copy of what it made, and EVAL scores each diff on the untouched
prepared copy."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from farm.agent.toolcalls import format_call
from farm.client import FarmClient
from farm.constants import JobState
from farm.embedded import EmbeddedStack
from farm.sandbox import sandbox_root
from tests.integration.conftest import scripted_stack
from tests.integration.sandbox.conftest import require_bwrap

pytestmark = [pytest.mark.integration, pytest.mark.timeout(600)]

INSTANCE = "rollout-farm__semver-1"
GROUP = 8
SETUP = "mkdir -p build && echo stamp > build/stamp.txt"
PROBE = "cat build/stamp.txt && echo edited >> build/stamp.txt && echo lines=$(wc -l < build/stamp.txt)"


def _bash(command: str) -> str:
    return format_call("bash", {"command": command})


#: the reference fix in one short command (the tiny model's context holds a few turns only).
FIX = "sed -i 's/return (major, minor, patch), pre/return (int(major), int(minor), int(patch)), pre/' semver/version.py"
RULES = {
    "rules": [
        {
            "match": "fixing an issue in the repository",
            "turns": [_bash(f"{PROBE} && {FIX}"), format_call("submit", {})],
        }
    ]
}


@pytest.fixture(scope="module")
def groups_stack(
    tmp_path_factory: pytest.TempPathFactory, module_pg_url: str, redis_url: str, tiny_model_dir: Path
) -> Iterator[EmbeddedStack]:
    require_bwrap()
    with scripted_stack(
        tmp_path_factory.mktemp("groups-stack"),
        redis_url=redis_url,
        redis_offset=2,
        database_url=module_pg_url,
        model_dir=tiny_model_dir,
        node="groupsnode",
        rules=RULES,
    ) as stack:
        yield stack


def test_a_group_prepares_once_per_node_and_each_sample_works_in_its_own_copy(
    groups_stack: EmbeddedStack, tiny_tokenizer: Any
) -> None:
    with FarmClient(groups_stack.settings.api_url, token="e2e-token") as client:
        task = {"type": "swe", "config": {"instance_id": INSTANCE, "setup": SETUP, "max_turns": 5}}
        batch = client.submit([task], group_size=GROUP, sampling={"max_tokens": 400, "seed": 0})
        results = list(client.results(batch.id, wait_s=10, encoding="json"))
    assert len(results) == GROUP
    assert all(r.job.state is JobState.DONE for r in results), [r.job.reason for r in results]
    prepared = []
    for r in results:
        assert r.trajectory is not None, r.job.outcome
        assert r.trajectory.reward == 1.0, (r.job.outcome, r.trajectory.info)
        prepared.append(r.trajectory.info["prepared"])
        text = tiny_tokenizer.decode(r.trajectory.token_ids)
        # The setup's file, with this sample's own edit and no other's.
        assert "stamp" in text and "lines=2" in text
    assert sum(p["built"] for p in prepared) == 1  # one node, one preparation
    assert len({p["key"] for p in prepared}) == 1
    # EVAL's pristine copy: what the setup made, untouched by the eight agents.
    (key,) = {p["key"] for p in prepared}
    pristine = sandbox_root(groups_stack.settings) / "prepared" / key / "workspace"
    assert (pristine / "build" / "stamp.txt").read_text() == "stamp\n"
