"""The `harbor` package (PyPI, 0.25; Python >= 3.12, so in a venv of its own made by
scripts/setup_harbor.sh) reads every shipped Harbor task, and reads it as the farm does."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path
from typing import Any

import pytest

from tasks.harbor.dataset import EXAMPLES_DIR
from tasks.harbor.task import load_task

REPO = Path(__file__).resolve().parents[3]
HARBOR_PYTHON = Path(os.environ.get("FARM_HARBOR_VENV") or REPO / ".venv-harbor") / "bin" / "python"
TB_TASKS = REPO / "tests" / "tasks" / "handlers" / "tb_tasks"
TASK_DIRS = sorted(d for root in (EXAMPLES_DIR, TB_TASKS) for d in root.iterdir() if (d / "task.toml").is_file())

pytestmark = pytest.mark.images


def harbor_reading() -> dict[str, dict[str, Any]]:
    if not HARBOR_PYTHON.exists():
        message = f"no harbor environment at {HARBOR_PYTHON.parent.parent}: run scripts/setup_harbor.sh"
        if os.environ.get("CI"):
            pytest.fail(message)
        pytest.skip(message)
    script = Path(__file__).with_name("read_with_harbor.py")
    out = subprocess.run(
        [str(HARBOR_PYTHON), str(script), *map(str, TASK_DIRS)], capture_output=True, text=True, timeout=120
    )
    assert out.returncode == 0, out.stderr[-2000:]
    rows = [json.loads(line) for line in out.stdout.splitlines() if line.startswith("{")]
    return {row["path"]: row for row in rows}


def test_harbor_reads_every_shipped_task_as_the_farm_does() -> None:
    read = harbor_reading()
    assert sorted(read) == sorted(map(str, TASK_DIRS))
    for task_dir in TASK_DIRS:
        theirs, ours = read[str(task_dir)], load_task(task_dir)
        assert theirs["name"] in (ours.name, None) and theirs["instruction"].strip() == ours.instruction.strip()
        assert theirs["schema_version"] == ours.config.schema_version
        assert theirs["metadata"] == ours.config.metadata
        assert theirs["verifier"] == {"timeout_sec": ours.config.verifier.timeout_sec, "env": ours.config.verifier.env}
        assert theirs["agent"]["timeout_sec"] == ours.config.agent.timeout_sec
        env = ours.config.environment
        for key, value in theirs["environment"].items():
            if value is not None:  # Harbor leaves unset resources to the environment; the farm has defaults
                assert value == getattr(env, key), (task_dir.name, key)
