"""SWE-bench-style instances in their own images: the record and the image in, SWE-bench's verdict out.
Two instances are built here from small repositories (bash, so the image needs no Python; git is in it)."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path
from typing import Any

import pytest

from farm.agent.toolcalls import format_call
from farm.testing import run_stages
from farm.testing.images import DEFAULT_PROGRAMS, host_image
from tasks.swe_image.config import SweImageInstance
from tasks.swe_image.handler import SweImageHandler, grade, parse_log

RUNNER = """#!/bin/bash
# Prints one pytest -rA style line per test.
cd "$(dirname "$0")/.."
for t in tests/test_*.sh; do
  for fn in $(grep -o '^test_[a-z0-9_]*' "$t"); do
    if bash -c "source lib.sh; source $t; $fn" >/dev/null 2>&1; then s=PASSED; else s=FAILED; fi
    echo "$s $t::$fn"
  done
done
"""
REPOS: dict[str, dict[str, Any]] = {
    "calc": {
        "files": {
            "lib.sh": "add() { echo $(( $1 - $2 )); }\nmul() { echo $(( $1 * $2 )); }\n",
            "tests/run.sh": RUNNER,
            "tests/test_calc.sh": 'test_mul() { [ "$(mul 3 4)" = 12 ]; }\n',
        },
        "issue": "add 2 3 prints -1 instead of 5.",
        "fix": "sed -i 's/\\$1 - \\$2/$1 + $2/' lib.sh",
        "test_patch_file": ("tests/test_add.sh", 'test_add() { [ "$(add 2 3)" = 5 ]; }\n'),
        "FAIL_TO_PASS": ["tests/test_add.sh::test_add"],
        "PASS_TO_PASS": ["tests/test_calc.sh::test_mul"],
    },
    "strutil": {
        "files": {
            "lib.sh": 'upper() { echo "$1" | tr a-z a-z; }\nrev3() { echo abc; }\n',
            "tests/run.sh": RUNNER,
            "tests/test_str.sh": 'test_rev3() { [ "$(rev3)" = abc ]; }\ntest_upper() { [ "$(upper abc)" = ABC ]; }\n',
        },
        "issue": "upper abc prints abc; it should print ABC.",
        "fix": "sed -i 's/tr a-z a-z/tr a-z A-Z/' lib.sh",
        "test_patch_file": None,
        "FAIL_TO_PASS": ["tests/test_str.sh::test_upper"],
        "PASS_TO_PASS": ["tests/test_str.sh::test_rev3"],
    },
}
GIT_ENV = {
    "GIT_AUTHOR_NAME": "farm", "GIT_AUTHOR_EMAIL": "farm@example.invalid", "GIT_COMMITTER_NAME": "farm",
    "GIT_COMMITTER_EMAIL": "farm@example.invalid", "GIT_AUTHOR_DATE": "2026-01-01T00:00:00Z",
    "GIT_COMMITTER_DATE": "2026-01-01T00:00:00Z", "GIT_CONFIG_GLOBAL": "/dev/null", "GIT_CONFIG_NOSYSTEM": "1",
}  # fmt: skip


def git(repo: Path, *args: str) -> str:
    env = {**os.environ, **GIT_ENV}
    return subprocess.run(["git", *args], cwd=repo, env=env, check=True, capture_output=True, text=True).stdout


def build_instance(name: str, tmp_path: Path) -> dict[str, Any]:
    """The repository at its base commit, in an image at /testbed; the record and image as a config."""
    spec = REPOS[name]
    repo = tmp_path / name
    for rel, text in spec["files"].items():
        (repo / rel).parent.mkdir(parents=True, exist_ok=True)
        (repo / rel).write_text(text)
    git(repo, "init", "-q", "-b", "main")
    git(repo, "add", "-A")
    git(repo, "commit", "-q", "-m", "base")
    base = git(repo, "rev-parse", "HEAD").strip()
    test_patch = ""
    if spec["test_patch_file"] is not None:  # the hidden test, as a diff made on a throwaway branch
        rel, text = spec["test_patch_file"]
        (repo / rel).write_text(text)
        git(repo, "add", "-A")
        test_patch = git(repo, "diff", "--cached", base)
        git(repo, "reset", "-q", "--hard", base)
    files: dict[str, Any] = {
        f"/testbed/{p.relative_to(repo)}": (p.read_bytes(), p.stat().st_mode & 0o777)
        for p in repo.rglob("*")
        if p.is_file()
    }
    image = host_image(tmp_path / f"{name}.tar", files=files, workdir="/testbed", programs=(*DEFAULT_PROGRAMS, "git"))
    record = {
        "instance_id": f"farm__{name}-1", "repo": f"farm/{name}", "base_commit": base,
        "problem_statement": spec["issue"], "test_cmd": "bash tests/run.sh", "FAIL_TO_PASS": spec["FAIL_TO_PASS"],
        "PASS_TO_PASS": spec["PASS_TO_PASS"], "test_patch": test_patch,
    }  # fmt: skip
    return {"instance": record, "image": str(image)}


def test_parse_log_and_grade_as_swe_bench() -> None:
    instance = SweImageInstance.model_validate({**build_record(), "FAIL_TO_PASS": ["a::x"], "PASS_TO_PASS": ["a::y"]})
    statuses = parse_log("PASSED a::x\nsome noise\nFAILED a::y - assert\n")
    assert statuses == {"a::x": "PASSED", "a::y": "FAILED"}
    assert grade(instance, statuses) == (False, {"a::x": "PASSED", "a::y": "FAILED"})
    assert grade(instance, {"a::x": "PASSED"})[1]["a::y"] == "MISSING"
    assert grade(instance, {"a::x": "PASSED", "a::y": "PASSED"})[0] is True


def build_record() -> dict[str, Any]:
    return {"instance_id": "i", "repo": "r", "base_commit": "abcdef0", "problem_statement": "p", "test_cmd": "true"}


@pytest.mark.images
@pytest.mark.parametrize("name", sorted(REPOS))
def test_swe_image_fix_resolves(name: str, tiny_tokenizer: Any, sandboxes: Any, tmp_path: Path) -> None:
    config = build_instance(name, tmp_path)
    fix = format_call("bash", {"command": REPOS[name]["fix"] + " && pwd && git status --short"})
    out = run_stages(
        SweImageHandler(), config, [fix, format_call("submit", {})], sandboxes=sandboxes, tokenizer=tiny_tokenizer
    )
    assert out.eval is not None
    assert out.eval.reward == 1.0, out.eval.info
    assert set(out.eval.info["swe"]["tests"].values()) == {"PASSED"}
    seen = tiny_tokenizer.decode(out.llm.prompts[1])
    assert "/testbed" in seen and "M lib.sh" in seen


@pytest.mark.images
@pytest.mark.parametrize("name", sorted(REPOS))
def test_swe_image_untouched_scores_zero(name: str, tiny_tokenizer: Any, sandboxes: Any, tmp_path: Path) -> None:
    config = build_instance(name, tmp_path)
    out = run_stages(
        SweImageHandler(), config, [format_call("submit", {})], sandboxes=sandboxes, tokenizer=tiny_tokenizer
    )
    assert out.init_state["patch"] == ""
    assert out.eval is not None
    assert out.eval.reward == 0.0, out.eval.info
    assert out.eval.info["swe"]["tests"][REPOS[name]["FAIL_TO_PASS"][0]] == "FAILED"


@pytest.mark.images
def test_swe_image_edited_tests_do_not_count(tiny_tokenizer: Any, sandboxes: Any, tmp_path: Path) -> None:
    # An agent that makes the failing test pass by rewriting the test itself is not resolved: the
    # hidden test_patch adds its own test, and an agent's diff touching it cannot be applied under it.
    config = build_instance("calc", tmp_path)
    cheat = format_call("bash", {"command": "printf 'test_add() { true; }\\n' > tests/test_add.sh"})
    out = run_stages(
        SweImageHandler(), config, [cheat, format_call("submit", {})], sandboxes=sandboxes, tokenizer=tiny_tokenizer
    )
    assert out.eval is not None
    assert out.eval.reward == 0.0, out.eval.info
