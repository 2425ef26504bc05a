"""Run a Harbor task's ``tests/test.sh`` and read the reward it writes.

Harbor uploads ``tests/`` to ``/tests`` and runs ``test.sh`` in the agent's environment, which
writes ``/logs/verifier/reward.txt`` (one number) or ``reward.json`` (``{"reward": x, ...}`` or
one number per metric). ``run_verifier`` does the same with directories of its own under
``scratch_dir`` and tells the script where they are through ``HARBOR_TESTS_DIR`` and
``HARBOR_VERIFIER_DIR``; a sandbox that bind-mounts them at ``/tests`` and ``/logs/verifier``
runs published scripts (which hard-code those paths) unchanged.

A reward of 0 is the agent failing. No reward file, an unreadable one, or a verifier past its
time limit is not: those raise ``VerifierError`` so the job is reported as an infrastructure
failure (or retried), never silently scored 0.
"""

from __future__ import annotations

import json
import math
import shutil
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from farm.errors import VerifierError
from tasks._proc import run_bounded
from tasks.harbor.task import HarborTask

#: output of test.sh kept for the error message / info.
MAX_OUTPUT_BYTES = 32_000


@dataclass(frozen=True)
class VerifierResult:
    """A reward the verifier wrote, its metrics (reward.json) and which file it came from."""

    reward: float
    metrics: dict[str, float] = field(default_factory=dict)
    returncode: int | None = None
    output: str = ""
    source: str = ""


def _number(value: Any) -> float | None:
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        return None
    return float(value)


def read_reward(verifier_dir: Path) -> tuple[float, dict[str, float], str]:
    """``(reward, metrics, file name)`` from reward.txt or reward.json (reward.txt wins if both exist).

    Raises:
        VerifierError: neither file exists, or the one found does not hold a finite number.
    """
    text_file, json_file = verifier_dir / "reward.txt", verifier_dir / "reward.json"
    if text_file.is_file():
        raw = text_file.read_text(encoding="utf-8", errors="replace").strip()
        try:
            value = float(raw)
        except ValueError:
            value = math.nan
        if not math.isfinite(value):
            raise VerifierError(f"reward.txt does not hold a number: {raw[:100]!r}", kind="bad_reward")
        return value, {}, "reward.txt"
    if json_file.is_file():
        try:
            data = json.loads(json_file.read_text(encoding="utf-8", errors="replace"))
        except ValueError as exc:
            raise VerifierError(f"reward.json is not valid JSON: {exc}", kind="bad_reward") from exc
        if not isinstance(data, dict):
            raise VerifierError("reward.json must be an object of metric -> number", kind="bad_reward")
        metrics = {k: v for k, v in ((str(k), _number(v)) for k, v in data.items()) if v is not None}
        if "reward" in data:
            reward = _number(data["reward"])
        else:
            reward = next(iter(metrics.values())) if len(metrics) == 1 and len(data) == 1 else None
        if reward is None:
            raise VerifierError(
                f'reward.json needs a numeric "reward" (or exactly one number), got keys {sorted(data)[:10]}',
                kind="bad_reward",
            )
        return reward, metrics, "reward.json"
    raise VerifierError("the verifier wrote neither reward.txt nor reward.json", kind="no_reward_file")


def seed_workdir(task: HarborTask, dest: Path) -> None:
    """Copy ``environment/workdir/`` (when the task has one) into ``dest``.

    Without Docker this is how the shipped examples give the agent its starting files (their
    Dockerfiles ``COPY workdir/ /app/``); tasks whose state lives in an image need a sandbox
    built from that image instead.
    """
    source = task.environment_dir / "workdir"
    dest.mkdir(parents=True, exist_ok=True)
    if source.is_dir():
        shutil.copytree(source, dest, dirs_exist_ok=True)


def run_verifier(
    task: HarborTask,
    *,
    workdir: Path,
    scratch_dir: Path,
    shell: Sequence[str] = ("bash",),
    timeout_s: float | None = None,
) -> VerifierResult:
    """Run ``tests/test.sh`` with ``workdir`` as its working directory and read the reward.

    Args:
        workdir: the agent's working directory (``/app`` in Harbor's images).
        scratch_dir: empty directory for ``tests/`` (a fresh copy: the agent never sees or edits it)
            and ``logs/verifier/``.
        shell: command prefix that runs the script, e.g. a sandbox wrapper ending in ``bash``.
        timeout_s: overrides task.toml's ``[verifier] timeout_sec``.

    Raises:
        VerifierError: no reward file, a garbled one, or the verifier timed out.
        OSError: the shell cannot be started.
    """
    tests_dir, verifier_dir = scratch_dir / "tests", scratch_dir / "logs" / "verifier"
    shutil.copytree(task.tests_dir, tests_dir)
    verifier_dir.mkdir(parents=True)
    limit = timeout_s if timeout_s is not None else task.config.verifier.timeout_sec
    env = {
        **task.config.verifier.env,
        "HARBOR_TESTS_DIR": str(tests_dir),
        "HARBOR_VERIFIER_DIR": str(verifier_dir),
        "HOME": str(scratch_dir),
    }
    proc = run_bounded(
        [*shell, str(tests_dir / "test.sh")], cwd=workdir, env=env, timeout_s=limit, max_output_bytes=MAX_OUTPUT_BYTES
    )
    output = (proc.stdout + proc.stderr)[-MAX_OUTPUT_BYTES:]
    if proc.timed_out:
        raise VerifierError(f"the verifier of {task.name} exceeded {limit:g} s", kind="timeout", output=output)
    try:
        reward, metrics, source = read_reward(verifier_dir)
    except VerifierError as exc:
        raise VerifierError(
            f"{task.name}: {exc.message} (test.sh exited with {proc.returncode})",
            kind=exc.kind,
            output=output,
        ) from exc
    return VerifierResult(reward=reward, metrics=metrics, returncode=proc.returncode, output=output, source=source)
