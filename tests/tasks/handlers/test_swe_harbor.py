"""swe and harbor handlers with real sandboxes, git and verifiers; the model is scripted."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from farm.agent.handler import AgentHandler
from farm.agent.toolcalls import format_call
from farm.constants import Outcome
from farm.errors import VerifierError
from farm.handlers.registry import get_handler
from farm.testing import run_stages
from tasks.harbor.dataset import EXAMPLES_DIR
from tasks.swe.dataset import instances_by_id

INSTANCE = "rollout-farm__semver-1"


def _bash(command: str) -> str:
    return format_call("bash", {"command": command})


def _apply(patch: str) -> str:
    return _bash(f"cat > /tmp/fix.diff <<'FARM_EOF'\n{patch}FARM_EOF\ngit apply /tmp/fix.diff && git status --short")


def test_swe_gold_patch_resolves(tiny_tokenizer: Any, sandboxes: Any) -> None:
    instance = instances_by_id()[INSTANCE]
    out = run_stages(
        get_handler("swe"),
        {"instance_id": INSTANCE},
        [_apply(instance.patch), format_call("submit", {})],
        sandboxes=sandboxes,
        tokenizer=tiny_tokenizer,
    )
    assert out.run.outcome is Outcome.OK, out.run.reason
    assert "semver/version.py" in out.init_state["patch"]
    assert out.eval is not None
    assert out.eval.reward == 1.0, out.eval.info
    assert set(out.eval.info["swe"]["tests"].values()) == {"PASSED"}
    # The real output of git status reached the model.
    assert "M semver/version.py" in tiny_tokenizer.decode(out.llm.prompts[1])


def test_swe_no_fix_scores_zero(tiny_tokenizer: Any, sandboxes: Any) -> None:
    out = run_stages(
        get_handler("swe"),
        {"instance_id": INSTANCE},
        [format_call("submit", {})],
        sandboxes=sandboxes,
        tokenizer=tiny_tokenizer,
    )
    assert out.init_state["patch"] == ""
    assert out.eval is not None and out.eval.reward == 0.0
    assert "did not pass" in out.eval.info["swe"]["reason"]


def test_swe_agent_edits_beyond_its_diff_never_reach_eval(tiny_tokenizer: Any, sandboxes: Any) -> None:
    """Rigged tests, a pass-everything conftest, sitecustomize and a process still running in the
    agent's sandbox: EVAL applies only the source diff to a fresh copy and runs in a new sandbox."""
    rig = (
        "printf 'import pytest\\n@pytest.hookimpl(tryfirst=True)\\n"
        "def pytest_runtest_call(item):\\n    return True\\n' > conftest.py; "
        "printf 'def test_x():\\n    pass\\n' > tests/test_numeric.py; "
        "echo 'import os' > sitecustomize.py; "
        "(while true; do echo 'def compare(a, b): return 1' >> semver/version.py; sleep 0.2; done) >/dev/null 2>&1 &"
    )
    out = run_stages(
        get_handler("swe"),
        {"instance_id": INSTANCE},
        [_bash(rig), format_call("submit", {})],
        sandboxes=sandboxes,
        tokenizer=tiny_tokenizer,
    )
    assert out.eval is not None
    assert out.eval.reward == 0.0, out.eval.info
    restored = out.eval.info["swe"]["restored"]
    assert "conftest.py" in restored and "sitecustomize.py" in restored


def test_swe_turn_budget_is_agent_error_and_still_scored(tiny_tokenizer: Any, sandboxes: Any) -> None:
    out = run_stages(
        get_handler("swe"),
        {"instance_id": INSTANCE, "max_turns": 2},
        [_bash("ls")],
        sandboxes=sandboxes,
        tokenizer=tiny_tokenizer,
    )
    assert out.run.outcome is Outcome.AGENT_ERROR
    assert "2 turns" in (out.run.reason or "")
    assert out.eval is not None and out.eval.reward == 0.0


def test_harbor_hello_file(tiny_tokenizer: Any, sandboxes: Any) -> None:
    handler = get_handler("harbor")
    solved = run_stages(
        handler,
        {"example": "hello-file"},
        [_bash("printf 'Hello, farm!\\n' > hello.txt && pwd"), format_call("submit", {})],
        sandboxes=sandboxes,
        tokenizer=tiny_tokenizer,
    )
    assert solved.eval is not None
    assert solved.eval.reward == 1.0, solved.eval.info
    assert "/app" in tiny_tokenizer.decode(solved.llm.prompts[1])
    unsolved = run_stages(
        handler, {"example": "hello-file"}, [format_call("submit", {})], sandboxes=sandboxes, tokenizer=tiny_tokenizer
    )
    assert unsolved.eval is not None and unsolved.eval.reward == 0.0


def test_harbor_reward_json_metrics(tiny_tokenizer: Any, sandboxes: Any) -> None:
    solve = (EXAMPLES_DIR / "fix-count-lines" / "solution" / "solve.sh").read_text()
    out = run_stages(
        get_handler("harbor"),
        {"example": "fix-count-lines"},
        [_bash(solve), format_call("submit", {})],
        sandboxes=sandboxes,
        tokenizer=tiny_tokenizer,
    )
    assert out.eval is not None
    assert out.eval.reward == 1.0, out.eval.info
    assert out.eval.metrics["cases_passed"] == out.eval.metrics["cases_total"] == 3
    assert out.eval.info["harbor"]["source"] == "reward.json"


def test_harbor_verifier_without_reward_is_infrastructure(tiny_tokenizer: Any, sandboxes: Any, tmp_path: Path) -> None:
    task = tmp_path / "silent-task"
    (task / "tests").mkdir(parents=True)
    (task / "instruction.md").write_text("Do nothing.\n")
    (task / "task.toml").write_text('version = "1.0"\n[verifier]\ntimeout_sec = 10.0\n')
    (task / "tests" / "test.sh").write_text("#!/usr/bin/env bash\necho 'forgot the reward'\n")
    with pytest.raises(VerifierError) as caught:
        run_stages(
            get_handler("harbor"),
            {"path": str(task)},
            [format_call("submit", {})],
            sandboxes=sandboxes,
            tokenizer=tiny_tokenizer,
        )
    assert caught.value.kind == "no_reward_file"
    assert caught.value.outcome == "infra_error"


def test_agent_killing_its_sandbox_is_a_sandbox_error_and_the_retry_starts_over(
    tiny_tokenizer: Any, sandboxes: Any
) -> None:
    """`kill -9 -1` takes the execution server with it: infrastructure (retried), never a reward.
    The retried RUN gets a new sandbox from the task's starting files; the broken one is closed."""
    from farm.constants import Stage
    from farm.errors import SandboxError
    from farm.sandbox.registry import Registry
    from farm.testing import ScriptedResources, stage_context

    handler = get_handler("harbor")
    config = handler.validate({"example": "hello-file"})
    llm = ScriptedResources(tiny_tokenizer, [_bash("kill -9 -1"), format_call("submit", {})])
    import asyncio

    state = asyncio.run(handler.init(config, stage_context(Stage.INIT, llm, sandboxes)))
    first = state.sandbox  # type: ignore[attr-defined]
    with pytest.raises(SandboxError):
        asyncio.run(handler.run(config, state, stage_context(Stage.RUN, llm, sandboxes, attempt=1)))
    llm.turns = [_bash("printf 'Hello, farm!\\n' > hello.txt"), format_call("submit", {})]
    run = asyncio.run(handler.run(config, state, stage_context(Stage.RUN, llm, sandboxes, attempt=2)))
    assert run.outcome is Outcome.OK and run.state["sandbox"] != first
    state = state.updated(run.state)
    result = asyncio.run(handler.evaluate(config, state, run.trajectory, stage_context(Stage.EVAL, llm, sandboxes)))
    assert result.reward == 1.0
    asyncio.run(handler.teardown(config, state, stage_context(Stage.EVAL, llm, sandboxes)))
    assert Registry(root=sandboxes._settings.sandbox.root_dir).records() == []


def test_budgets_from_the_spec(tiny_tokenizer: Any, sandboxes: Any) -> None:
    handler = get_handler("harbor")
    assert isinstance(handler, AgentHandler)
    config = handler.validate({"example": "hello-file", "time_limit_s": 5, "max_episode_tokens": 100})
    budgets = handler.budgets(config)
    assert budgets.wall_time_s == 5 and budgets.max_tokens == 100
    assert handler.budgets(handler.validate({"example": "hello-file"})).wall_time_s == 120.0  # task.toml [agent]
    out = run_stages(
        get_handler("swe"),
        {"instance_id": INSTANCE, "max_episode_tokens": 30},
        [_bash("ls -la && git log --oneline && cat README.md")],
        sandboxes=sandboxes,
        tokenizer=tiny_tokenizer,
    )
    assert out.run.outcome is Outcome.AGENT_ERROR and "30 tokens" in (out.run.reason or "")
