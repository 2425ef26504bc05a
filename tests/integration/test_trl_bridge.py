"""TRL's AsyncGRPOTrainer trains through the farm end to end (opt-in: --run-trl; scripts/setup_trl.sh).

``examples/trl_grpo_cpu.py`` runs, short, against a farm on the test's PostgreSQL and Redis: TRL's
own trainer takes every rollout from ``FarmRolloutWorker`` and hands its weights back through
``FarmWeightTransfer`` after each step (pause, load, resume, on the built-in backend over HTTP).
Every trained token's logprob, recomputed by TRL's model on its packed batch with the weights that
sampled it, matches the farm's; every job the farm finished became its samples exactly once, and
the trainer took or still held every sample made."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from tests.integration.conftest import free_port, side_redis_url

pytestmark = [pytest.mark.trl, pytest.mark.integration, pytest.mark.timeout(900)]

REPO = Path(__file__).resolve().parents[2]
STEPS = 3


def run_example(tmp_path: Path, redis_url: str, database_url: str, *extra: str) -> dict[str, Any]:
    pytest.importorskip("trl", reason="TRL is not installed: run scripts/setup_trl.sh")
    env = {
        **os.environ,
        "FARM_REDIS__URL": redis_url,
        "FARM_DATABASE__URL": database_url,
        "FARM_API__PORT": str(free_port()),
        "FARM_PROXY__PORT": str(free_port()),
        "FARM_LLM__BUILTIN_PORT": str(free_port()),
        "PYTHONPATH": str(REPO),
    }
    args = ["--steps", str(STEPS), "--prompts", "2", "--group", "4", "--out", str(tmp_path / "run"), *extra]
    done = subprocess.run(
        [sys.executable, str(REPO / "examples/trl_grpo_cpu.py"), *args],
        capture_output=True,
        text=True,
        timeout=840,
        cwd=REPO,
        env=env,
    )
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-4000:]
    return dict(json.loads(done.stdout.strip().splitlines()[-1]))


def test_trl_trains_through_the_farm_on_policy_with_every_logprob_matching(
    tmp_path: Path, redis_url: str, own_pg_url: str
) -> None:
    out = run_example(tmp_path, side_redis_url(redis_url, 1), own_pg_url)
    assert out["steps"] == STEPS
    # the cold sync at train begin, then one per step
    assert out["weight_updates"] == STEPS + 1
    assert out["checked_tokens"] > 0 and out["unchecked_batches"] == 0
    assert out["max_logprob_gap"] <= 1e-3
    assert out["samples_lost"] == 0 and out["samples_duplicated"] == 0
    assert out["failed_jobs"] == 0 and out["taken_stale"] == 0


def test_rollouts_in_flight_across_weight_updates_lose_and_duplicate_nothing(
    tmp_path: Path, redis_url: str, own_pg_url: str
) -> None:
    # One step of staleness: the next step's groups run while the trainer steps and syncs (mode keep).
    out = run_example(tmp_path, side_redis_url(redis_url, 2), own_pg_url, "--max-staleness", "1")
    assert out["steps"] == STEPS and out["weight_updates"] == STEPS + 1
    assert out["samples_lost"] == 0 and out["samples_duplicated"] == 0
    assert out["max_logprob_gap"] <= 1e-3
