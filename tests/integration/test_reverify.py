"""`farm reverify`: a batch's stored rollouts scored again by the grader installed now, without the
model or the agent. The rollouts come from a real farm (workers, the scripted built-in backend over
HTTP, real sandboxes); the re-verification runs in this process, where the grader is changed."""

from __future__ import annotations

import json
import re
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner, Result
from sqlalchemy import create_engine, text

from farm.agent.toolcalls import format_call
from farm.cli import main
from farm.client import FarmClient
from farm.constants import JobState
from farm.embedded import EmbeddedStack, settings_env
from tasks.harbor.dataset import EXAMPLES_DIR
from tests.integration.conftest import scripted_stack
from tests.integration.sandbox.conftest import require_bwrap

pytestmark = [pytest.mark.integration, pytest.mark.timeout(300)]

FENCE = "`" * 3
RULES = {
    "rules": [
        {"match": "reverify-math-solved", "turns": ["Six sevens: \\boxed{42}"]},
        {"match": "reverify-math-failed", "turns": ["I guess \\boxed{41}"]},
        {"match": "reverify-code-solved", "turns": [f"{FENCE}python\ndef add(a, b):\n    return a + b\n{FENCE}"]},
        {
            "match": "reverify-harbor",
            "turns": [format_call("bash", {"command": "echo nothing to do"}), format_call("submit", {})],
        },
    ]
}
MATH_SOLVED = {"type": "math", "config": {"problem": "reverify-math-solved: 6 * 7 = ?", "answer": "42"}}
MATH_FAILED = {"type": "math", "config": {"problem": "reverify-math-failed: 6 * 7 = ?", "answer": "42"}}
CODE_SOLVED = {
    "type": "code",
    "config": {
        "problem": {
            "id": "reverify-add",
            "entry_point": "add",
            "signature": "add(a: int, b: int) -> int",
            "prompt": "reverify-code-solved: return the sum of a and b.",
            "tests": ["assert add(1, 2) == 3", "assert add(-1, 1) == 0"],
        },
        "max_turns": 1,
    },
}


@pytest.fixture(scope="module")
def reverify_stack(
    tmp_path_factory: pytest.TempPathFactory, module_pg_url: str, redis_url: str, tiny_model_dir: Path
) -> Iterator[EmbeddedStack]:
    require_bwrap()
    with scripted_stack(
        tmp_path_factory.mktemp("reverify-stack"),
        redis_url=redis_url,
        redis_offset=3,
        database_url=module_pg_url,
        model_dir=tiny_model_dir,
        node="reverifynode",
        rules=RULES,
    ) as stack:
        yield stack


@pytest.fixture
def client(reverify_stack: EmbeddedStack) -> Iterator[FarmClient]:
    with FarmClient(reverify_stack.settings.api_url, token="e2e-token") as c:
        yield c


def run_batch(client: FarmClient, tasks: list[dict[str, Any]]) -> tuple[int, dict[int, float | None]]:
    """Submit, wait for every job; the batch id and each job's stored reward."""
    batch = client.submit(tasks, group_size=1, sampling={"max_tokens": 200, "seed": 0})
    results = list(client.results(batch.id, wait_s=10, encoding="json"))
    assert all(r.job.state is JobState.DONE for r in results), [r.job.reason for r in results]
    return batch.id, {r.job.id: r.job.reward for r in results}


def reverify(stack: EmbeddedStack, *args: str) -> Result:
    env = {**settings_env(stack.settings), "COLUMNS": "160"}
    return CliRunner().invoke(main, ["reverify", *args], env=env, catch_exceptions=False)


def rollouts(result: Result) -> dict[int, dict[str, Any]]:
    assert result.exit_code == 0, result.output
    return {row["job_id"]: row for row in json.loads(result.stdout)["rollouts"]}


def test_reverify_finds_the_rewards_a_grader_change_changes(
    reverify_stack: EmbeddedStack, client: FarmClient, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Given a batch scored by the graders the workers run: math 1 and 0, code 1 (hidden tests in a sandbox)
    batch_id, stored = run_batch(client, [MATH_SOLVED, MATH_FAILED, CODE_SOLVED])
    solved, failed, code = sorted(stored)
    assert [stored[solved], stored[failed], stored[code]] == [1.0, 0.0, 1.0]

    # When re-verified with the same graders, nothing changes (the stored inputs are enough to score)
    same = rollouts(reverify(reverify_stack, str(batch_id), "--json"))
    assert {j: (r["new_reward"], r["changed"], r["error"]) for j, r in same.items()} == {
        solved: (1.0, False, None),
        failed: (0.0, False, None),
        code: (1.0, False, None),
    }

    # When the math grader changes in this process (the reference "was" 41) and the batch is re-verified
    def graded_against_41(response: str, reference: str, **_: Any) -> tuple[float, dict[str, Any]]:
        return float(re.search(r"\\boxed\{41\}", response) is not None), {"reason": "patched"}

    monkeypatch.setattr("tasks.math.handler.grade", graded_against_41)
    changed = rollouts(reverify(reverify_stack, str(batch_id), "--json", "--record"))

    # Then both math rollouts are reported with their old and new rewards, the code one is not
    assert {j: (r["old_reward"], r["new_reward"]) for j, r in changed.items() if r["changed"]} == {
        solved: (1.0, 0.0),
        failed: (0.0, 1.0),
    }
    assert changed[code]["changed"] is False
    # And the text report names them
    table = reverify(reverify_stack, str(batch_id))
    assert table.exit_code == 0 and re.search(rf"{solved}\s.*math\s.*1\.0\s.*0\.0", table.output), table.output
    assert "3 rollouts scored again, 2 changed, 0 failed" in table.output
    # And the stored rewards are untouched; the new scores are kept beside them (--record)
    assert {r.job.id: r.job.reward for r in client.results(batch_id, encoding="json")} == stored
    engine = create_engine(reverify_stack.settings.database_url)
    try:
        with engine.connect() as conn:
            rows = conn.execute(text("SELECT id, stage_data FROM jobs WHERE batch_id = :b"), {"b": batch_id}).all()
    finally:
        engine.dispose()
    kept = {row.id: row.stage_data if isinstance(row.stage_data, dict) else json.loads(row.stage_data) for row in rows}
    assert {j: data["reverify"]["reward"] for j, data in kept.items()} == {solved: 0.0, failed: 1.0, code: 1.0}


def test_reverify_refuses_an_unsafe_grader_unless_forced(
    reverify_stack: EmbeddedStack, client: FarmClient, tmp_path: Path
) -> None:
    # Given a batch with a harbor rollout (its verifier reads the agent's sandbox, gone once the job ended)
    harbor_dir = tmp_path / "reverify-harbor"
    shutil.copytree(EXAMPLES_DIR / "hello-file", harbor_dir)
    (harbor_dir / "instruction.md").write_text("reverify-harbor: create hello.txt holding Hello, farm!\n")
    harbor = {"type": "harbor", "config": {"path": str(harbor_dir), "max_turns": 2}}
    batch_id, stored = run_batch(client, [MATH_SOLVED, harbor])
    math_job, harbor_job = sorted(stored)

    # When re-verified without --force, it is refused, naming the task type, and nothing is scored
    refused = reverify(reverify_stack, str(batch_id), "--record")
    assert refused.exit_code == 2
    assert "refused" in refused.output and "harbor (1 rollouts)" in refused.output and "--force" in refused.output

    # When forced, every rollout is tried: math is scored, harbor's verifier finds no sandbox to read
    forced = reverify(reverify_stack, str(batch_id), "--force", "--json")
    rows = rollouts(forced)
    assert json.loads(forced.stdout)["forced"] == {"harbor": 1}
    assert rows[math_job]["new_reward"] == 1.0 and rows[math_job]["error"] is None
    assert rows[harbor_job]["new_reward"] is None and "SandboxError" in rows[harbor_job]["error"]
    assert rows[harbor_job]["changed"] is False
    assert {r.job.id: r.job.reward for r in client.results(batch_id, encoding="json")} == stored


def test_reverify_of_a_batch_that_does_not_exist_says_so(reverify_stack: EmbeddedStack) -> None:
    missing = reverify(reverify_stack, "987654321")
    assert missing.exit_code == 2 and "no batch with id 987654321" in missing.output  # not found: 2, as everywhere
