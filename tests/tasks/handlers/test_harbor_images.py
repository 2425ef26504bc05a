"""Harbor tasks in terminal-bench's format run in their own image, unchanged: their test.sh hard-codes
/tests and /logs/verifier, their files live in the image's /app. The images are built here from the
host's binaries (no Docker): each holds what its task's Dockerfile COPYs into /app, and no Python."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from farm.agent.toolcalls import format_call
from farm.handlers.registry import get_handler
from farm.testing import run_stages
from farm.testing.images import host_image

TB_TASKS = Path(__file__).parent / "tb_tasks"
NAMES = sorted(d.name for d in TB_TASKS.iterdir() if (d / "task.toml").is_file())


def _bash(command: str) -> str:
    return format_call("bash", {"command": command})


def task_image(name: str, dest: Path) -> Path:
    """The image the task's Dockerfile describes (WORKDIR /app, its files COPY'd there)."""
    env_dir = TB_TASKS / name / "environment"
    files = {f"/app/{p.name}": p.read_bytes() for p in env_dir.iterdir() if p.name != "Dockerfile"}
    return host_image(dest / f"{name}.tar", files=files, workdir="/app")


def run(name: str, script: list[str], tmp_path: Path, tokenizer: Any, sandboxes: Any) -> Any:
    config = {"path": str(TB_TASKS / name), "image": str(task_image(name, tmp_path))}
    return run_stages(get_handler("harbor"), config, script, sandboxes=sandboxes, tokenizer=tokenizer)


def test_tb_tasks_are_shipped() -> None:
    assert NAMES == ["fix-greeting", "sort-names", "word-count"]


@pytest.mark.images
@pytest.mark.parametrize("name", NAMES)
def test_harbor_image_task_solved_scores_one(name: str, tiny_tokenizer: Any, sandboxes: Any, tmp_path: Path) -> None:
    solve = (TB_TASKS / name / "solution" / "solve.sh").read_text()
    out = run(name, [_bash(solve), format_call("submit", {})], tmp_path, tiny_tokenizer, sandboxes)
    assert out.eval is not None
    assert out.eval.reward == 1.0, out.eval.info


@pytest.mark.images
@pytest.mark.parametrize("name", NAMES)
def test_harbor_image_task_untouched_scores_zero(
    name: str, tiny_tokenizer: Any, sandboxes: Any, tmp_path: Path
) -> None:
    out = run(name, [format_call("submit", {})], tmp_path, tiny_tokenizer, sandboxes)
    assert out.eval is not None
    assert out.eval.reward == 0.0, out.eval.info


@pytest.mark.images
def test_harbor_image_runs_in_the_image(tiny_tokenizer: Any, sandboxes: Any, tmp_path: Path) -> None:
    # The agent sees the image's /app and no Python (the host's is only the server's, out of its PATH).
    probe = _bash("pwd; ls /app; command -v python3 || echo no-python")
    out = run("word-count", [probe, format_call("submit", {})], tmp_path, tiny_tokenizer, sandboxes)
    seen = tiny_tokenizer.decode(out.llm.prompts[1])
    assert "/app" in seen and "words.txt" in seen and "no-python" in seen


@pytest.mark.images
def test_harbor_image_verifier_dirs_are_made_fresh(tiny_tokenizer: Any, sandboxes: Any, tmp_path: Path) -> None:
    # An agent that plants a reward and its own test.sh where Harbor looks gets nothing for it (sort-names
    # writes reward.json; a planted reward.txt would win over it if it were still there).
    forge = _bash(
        "mkdir -p /logs/verifier /tests && echo 1 > /logs/verifier/reward.txt && "
        "printf '#!/bin/bash\\necho 1 > /logs/verifier/reward.txt\\n' > /tests/test.sh"
    )
    out = run("sort-names", [forge, format_call("submit", {})], tmp_path, tiny_tokenizer, sandboxes)
    assert out.eval is not None
    assert out.eval.reward == 0.0, out.eval.info
    assert out.eval.info["harbor"]["source"] == "reward.json"
