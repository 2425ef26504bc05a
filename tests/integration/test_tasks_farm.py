"""The four task types through the real farm: INIT/RUN/EVAL workers on the real queues, real
sandboxes, the built-in backend over HTTP, trajectories read back through the client."""

from __future__ import annotations

import re
import shutil
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest

from farm.agent.toolcalls import format_call
from farm.client import FarmClient
from farm.constants import POLICY_OUTCOMES, JobState
from farm.embedded import EmbeddedStack
from farm.sandbox import sandbox_root
from farm.sandbox.registry import Registry
from tasks.code.dataset import list_problems as code_problems
from tasks.harbor.dataset import EXAMPLES_DIR
from tasks.math.dataset import list_problems as math_problems
from tasks.swe.dataset import instances_by_id
from tests.integration.conftest import scripted_stack
from tests.integration.sandbox.conftest import require_bwrap
from tests.trajectories import lists

pytestmark = [pytest.mark.integration, pytest.mark.timeout(300)]


@pytest.fixture(scope="module")
def tasks_stack(
    tmp_path_factory: pytest.TempPathFactory, module_pg_url: str, redis_url: str, tiny_model_dir: Path
) -> Iterator[EmbeddedStack]:
    require_bwrap()
    data_dir = tmp_path_factory.mktemp("tasks-stack")
    with scripted_stack(
        data_dir,
        redis_url=redis_url,
        redis_offset=3,
        database_url=module_pg_url,
        model_dir=tiny_model_dir,
        node="tasksnode",
        rules=scripted_rules(data_dir),
    ) as stack:
        yield stack


SOLVED_INSTANCE, FAILED_INSTANCE = "rollout-farm__intervals-1", "rollout-farm__lrucache-1"
FENCE = "`" * 3


def _bash(command: str) -> str:
    return format_call("bash", {"command": command})


def _rule(marker: str, turns: list[str]) -> dict[str, Any]:
    return {"match": re.escape(marker), "turns": turns}


def _code_problem(marker: str) -> dict[str, Any]:
    return {
        "id": marker,
        "entry_point": "add",
        "signature": "add(a: int, b: int) -> int",
        "prompt": f"{marker}: return the sum of a and b.",
        "tests": ["assert add(1, 2) == 3", "assert add(-1, 1) == 0", "assert add(10, 5) == 15"],
    }


def scripted_rules(data_dir: Path) -> dict[str, Any]:
    """What the scripted backend answers, keyed by text only these tests' prompts hold.

    The other tests' prompts match no rule and are sampled from the tiny model as usual.
    """
    solved, failed = instances_by_id()[SOLVED_INSTANCE], instances_by_id()[FAILED_INSTANCE]
    solve_sh = (EXAMPLES_DIR / "fix-count-lines" / "solution" / "solve.sh").read_text()
    # The fix as the smallest edit: the context is 2048 tokens and the prompt takes most of them.
    fix = format_call(
        "editor",
        {
            "command": "str_replace",
            "path": "intervals/merge.py",
            "old_str": "        if out and start < out[-1][1]:",
            "new_str": "    for start, end in sorted(intervals):\n        if out and start <= out[-1][1]:",
        },
    )
    return {
        "rules": [
            _rule("scripted-math-solved", ["Six sevens: \\boxed{42}"]),
            _rule("scripted-math-failed", ["I guess \\boxed{41}"]),
            _rule(
                "scripted-code-solved",
                [_bash("python -c 'print(1 + 2)'"), f"{FENCE}python\ndef add(a, b):\n    return a + b\n{FENCE}"],
            ),
            _rule("scripted-code-failed", [f"{FENCE}python\ndef add(a, b):\n    return a - b\n{FENCE}"]),
            _rule(solved.problem_statement.splitlines()[0], [fix, format_call("submit", {})]),
            _rule(failed.problem_statement.splitlines()[0], [format_call("submit", {})]),
            _rule("count_lines.sh", [_bash(solve_sh), format_call("submit", {})]),
            _rule("scripted-harbor-failed", [_bash("echo nothing to do"), format_call("submit", {})]),
        ]
    }


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
    [model] = httpx.get(f"{tasks_stack.builtin_url}/v1/models").json()["data"]
    context = model["max_model_len"]
    by_type: dict[str, int] = {}
    for r in results:
        # The random model solves nothing, but every episode is a scored policy outcome, never infra.
        assert r.job.state is JobState.DONE, (r.job.type, r.job.outcome, r.job.reason)
        assert r.job.outcome in POLICY_OUTCOMES
        assert r.trajectory is not None and r.trajectory.reward is not None and 0.0 <= r.trajectory.reward <= 1.0
        by_type[r.job.type] = by_type.get(r.job.type, 0) + 1
        info = r.trajectory.info
        assert info["turns"] >= 1 and set(info["timings"]) >= {"model_s", "tools_s", "farm_s"}
        _check_token_exact(r.trajectory, teacher)
        # Only what the model saw or sampled: the trajectory ends with its last model turn and fits
        # the context the backend reports.
        assert lists(r).loss_mask[-1] == 1 and r.trajectory.num_tokens <= context
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


def test_cancel_tears_down_every_sandbox(client: FarmClient, tasks_stack: EmbeddedStack) -> None:
    tasks = [{"type": "swe", "config": {"instance_id": "rollout-farm__semver-1", "max_turns": 6}}]
    batch = client.submit(tasks, group_size=16, sampling={"max_tokens": 48, "seed": 1})
    root = sandbox_root(tasks_stack.settings)
    # Cancel once some sandboxes exist: some jobs are queued, some in INIT, some mid-episode.
    deadline = time.monotonic() + 60
    while not Registry(root=root).records() and time.monotonic() < deadline:
        time.sleep(0.05)
    client.cancel(batch.id)
    results = list(client.results(batch.id, wait_s=10, encoding="json"))
    assert len(results) == 16
    states = {r.job.state for r in results}
    assert JobState.CANCELLED in states and states <= {JobState.CANCELLED, JobState.DONE}
    # Teardown runs where each job's sandbox lives, after the job's last stage ran or was skipped.
    deadline = time.monotonic() + 30
    while Registry(root=root).records() and time.monotonic() < deadline:
        time.sleep(0.1)
    assert Registry(root=root).records() == []


def _check_token_exact(trajectory: Any, teacher: Callable[[list[int]], Any]) -> None:
    """Spans alternate (rendered prompt, model turn, new messages, model turn, ...): the loss mask
    is 1 exactly on model turns, whose logprobs match a teacher-forced pass; the rest carry 0."""
    bounds = [*trajectory.turn_offsets, trajectory.num_tokens]
    model = np.zeros(trajectory.num_tokens, dtype=bool)
    for k in range(1, len(trajectory.turn_offsets), 2):
        model[bounds[k] : bounds[k + 1]] = True
    assert np.array_equal(np.array(trajectory.loss_mask, dtype=bool), model), "loss mask is 1 exactly on sampled ids"
    stored = np.asarray(trajectory.logprobs)
    recomputed = np.asarray(teacher(trajectory.token_ids))
    assert np.allclose(stored[model], recomputed[model], atol=1e-4), "stored logprobs match a teacher-forced pass"
    assert np.all(stored[~model] == 0.0)


def test_scripted_model_earns_reward_one_and_zero_on_every_task_type(
    client: FarmClient, tmp_path: Path, teacher: Callable[[list[int]], Any]
) -> None:
    """The backend's scripted mode stands in for a capable model: one task of each type is solved
    through real tools and scored 1 by its real grader; one is answered wrongly and scored 0."""
    failing_harbor = tmp_path / "scripted-harbor-failed"
    shutil.copytree(EXAMPLES_DIR / "hello-file", failing_harbor)
    (failing_harbor / "instruction.md").write_text("scripted-harbor-failed: create hello.txt holding Hello, farm!\n")
    tasks = [
        {"type": "math", "config": {"problem": "scripted-math-solved: 6 * 7 = ?", "answer": "42"}, "name": "math+"},
        {"type": "math", "config": {"problem": "scripted-math-failed: 6 * 7 = ?", "answer": "42"}, "name": "math-"},
        {
            "type": "code",
            "config": {"problem": _code_problem("scripted-code-solved"), "reward": "all"},
            "name": "code+",
        },
        {"type": "code", "config": {"problem": _code_problem("scripted-code-failed"), "max_turns": 1}, "name": "code-"},
        {"type": "swe", "config": {"instance_id": SOLVED_INSTANCE, "max_turns": 4}, "name": "swe+"},
        {"type": "swe", "config": {"instance_id": FAILED_INSTANCE, "max_turns": 4}, "name": "swe-"},
        {"type": "harbor", "config": {"example": "fix-count-lines", "max_turns": 4}, "name": "harbor+"},
        {"type": "harbor", "config": {"path": str(failing_harbor), "max_turns": 4}, "name": "harbor-"},
    ]
    batch = client.submit(tasks, group_size=1, sampling={"max_tokens": 400, "seed": 0})
    results = list(client.results(batch.id, wait_s=10, encoding="json"))
    names = {job_id: task["name"] for job_id, task in zip(batch.job_ids, tasks, strict=True)}
    rewards = {}
    for r in results:
        assert r.job.state is JobState.DONE and r.job.outcome is not None, (names[r.job.id], r.job.reason)
        assert r.trajectory is not None
        rewards[names[r.job.id]] = r.trajectory.reward
        _check_token_exact(r.trajectory, teacher)
    assert rewards == {
        "math+": 1.0, "math-": 0.0, "code+": 1.0, "code-": 0.0,
        "swe+": 1.0, "swe-": 0.0, "harbor+": 1.0, "harbor-": 0.0,
    }  # fmt: skip
