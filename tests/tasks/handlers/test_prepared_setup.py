"""A task's setup runs once per node and every sample starts from a private copy of what it made;
EVAL scores the agent's diff on that same untouched copy. Real sandboxes, git and pytest; the
model is scripted."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest

from farm.agent.toolcalls import format_call
from farm.config import Settings
from farm.constants import Outcome, Stage
from farm.errors import TaskSetupFailed
from farm.handlers.registry import get_handler
from farm.testing import ScriptedResources, run_stages, stage_context
from farm.worker.sandboxes import SandboxResources
from tasks.swe.dataset import instances_by_id

INSTANCE = "rollout-farm__semver-1"
#: products a dependency install or a build leaves: one under a ``tests`` directory, which EVAL
#: would otherwise restore away as a test file the patch added.
SETUP = (
    "mkdir -p build/tests && echo stamp > build/stamp.txt && echo fixture > build/tests/data.txt && "
    'python -c \'import sys; open("build/python.txt", "w").write(sys.version)\' && '
    # A FIFO would block a naive copy of the workspace back to the host for ever.
    "mkfifo build/pipe && ln -s /etc/hostname build/link"
)
#: each sample reads what the setup made, then edits it: it must see its own edit alone.
PROBE = "cat build/stamp.txt && echo edited >> build/stamp.txt && echo lines=$(wc -l < build/stamp.txt)"


def _bash(command: str) -> str:
    return format_call("bash", {"command": command})


def _apply(patch: str) -> str:
    return _bash(f"cat > /tmp/fix.diff <<'FARM_EOF'\n{patch}FARM_EOF\ngit apply /tmp/fix.diff && git status --short")


def _prepared_dirs(sandboxes: SandboxResources) -> list[Path]:
    root = sandboxes._settings.sandbox.root_dir
    assert root is not None
    return sorted(p for p in (root / "prepared").iterdir() if p.is_dir())


def test_swe_setup_runs_once_and_every_sample_starts_from_its_own_copy(
    tiny_tokenizer: Any, sandboxes: SandboxResources
) -> None:
    instance = instances_by_id()[INSTANCE]
    config = {"instance_id": INSTANCE, "setup": SETUP}
    turns = [_bash(PROBE), _apply(instance.patch), format_call("submit", {})]
    samples = [
        run_stages(get_handler("swe"), config, turns, sandboxes=sandboxes, tokenizer=tiny_tokenizer) for _ in range(3)
    ]
    built = [s.run.trajectory.info["prepared"]["built"] for s in samples]
    assert built == [True, False, False]
    assert len({s.run.trajectory.info["prepared"]["key"] for s in samples}) == 1
    for sample in samples:
        seen = tiny_tokenizer.decode(sample.llm.prompts[1])
        assert "stamp" in seen and "lines=2" in seen, seen  # the setup's file, and no other sample's edit
        patch = sample.init_state["patch"]
        assert "semver/version.py" in patch and "build/" not in patch  # the setup's products are not the agent's
        assert sample.eval is not None
        assert sample.eval.reward == 1.0, sample.eval.info
        assert not any(p.startswith("build/") for p in sample.eval.info["swe"]["restored"])
    # EVAL scored on the prepared workspace, which no agent touched.
    (prepared,) = _prepared_dirs(sandboxes)
    assert (prepared / "workspace" / "build" / "stamp.txt").read_text() == "stamp\n"
    assert not (prepared / "workspace" / "build" / "pipe").exists()
    assert (prepared / "workspace" / "build" / "link").is_symlink()  # kept as a link, never followed


def test_without_sharing_every_sample_prepares_its_own(tiny_tokenizer: Any, tmp_path: Path) -> None:
    settings = Settings(
        data_dir=tmp_path / "data",
        sandbox={"root_dir": tmp_path / "sb", "tool_timeout_s": 30.0, "share_preparation": False},
    )
    sandboxes = SandboxResources(settings)
    config = {"instance_id": INSTANCE, "setup": SETUP}
    built = [
        run_stages(
            get_handler("swe"),
            config,
            [_bash(PROBE), format_call("submit", {})],
            sandboxes=sandboxes,
            tokenizer=tiny_tokenizer,
        ).run.trajectory.info["prepared"]["built"]
        for _ in range(2)
    ]
    assert built == [True, True]
    assert not (tmp_path / "sb" / "prepared").exists()


@pytest.mark.parametrize(
    ("setup", "why"),
    [
        ("echo broken >&2; exit 7", "exited with 7"),
        ("echo '# changed' >> pyproject.toml", "changed files of the base commit"),
        (
            "git -c user.name=x -c user.email=x@x commit -q --allow-empty -m more",
            "made a commit",
        ),
    ],
)
def test_a_setup_that_fails_or_leaves_an_unusable_start_is_the_tasks_error(
    tiny_tokenizer: Any, sandboxes: SandboxResources, setup: str, why: str
) -> None:
    handler = get_handler("swe")
    config = handler.validate({"instance_id": INSTANCE, "setup": setup})
    llm = ScriptedResources(tiny_tokenizer, [format_call("submit", {})])
    with pytest.raises(TaskSetupFailed, match=why) as caught:
        asyncio.run(handler.init(config, stage_context(Stage.INIT, llm, sandboxes)))
    assert caught.value.outcome == "handler_error"
    assert _prepared_dirs(sandboxes) == []  # nothing half-prepared is kept


def test_a_setup_past_its_time_limit_is_stopped(tiny_tokenizer: Any, sandboxes: SandboxResources) -> None:
    handler = get_handler("harbor")
    config = handler.validate({"example": "hello-file", "setup": "sleep 60", "setup_timeout_s": 1})
    llm = ScriptedResources(tiny_tokenizer, [format_call("submit", {})])
    with pytest.raises(TaskSetupFailed, match="setup_timeout_s"):
        asyncio.run(handler.init(config, stage_context(Stage.INIT, llm, sandboxes)))


def test_harbor_setup_is_prepared_once_and_seen_by_every_sample(
    tiny_tokenizer: Any, sandboxes: SandboxResources
) -> None:
    config = {"example": "hello-file", "setup": "echo from-setup > prepared.txt"}
    turns = [_bash("cat prepared.txt && printf 'Hello, farm!\\n' > hello.txt"), format_call("submit", {})]
    samples = [
        run_stages(get_handler("harbor"), config, turns, sandboxes=sandboxes, tokenizer=tiny_tokenizer)
        for _ in range(2)
    ]
    assert [s.run.trajectory.info["prepared"]["built"] for s in samples] == [True, False]
    for sample in samples:
        assert sample.run.outcome is Outcome.OK
        assert "from-setup" in tiny_tokenizer.decode(sample.llm.prompts[1])
        assert sample.eval is not None
        assert sample.eval.reward == 1.0, sample.eval.info
    # A different setup is a different starting point.
    other = run_stages(
        get_handler("harbor"),
        {**config, "setup": "echo other > prepared.txt"},
        turns,
        sandboxes=sandboxes,
        tokenizer=tiny_tokenizer,
    )
    assert other.run.trajectory.info["prepared"]["built"] is True
    assert "other" in tiny_tokenizer.decode(other.llm.prompts[1])
