"""Stragglers: the trainer's wait per step without deadlines vs with a quorum and carry, same run.

    python bench/stragglers.py [--jobs 512] [--steps 5] [--hang 0.01] [--fraction 0.95]

Each step is a batch of ``--jobs`` echo jobs on the embedded stack (PostgreSQL, Redis, real Celery
workers). A job's text has a random length (16-400 characters, its trajectory's length) and its RUN
takes a heavy-tailed time, lognormal (median ``--median-s``, sigma ``--sigma``), longer for longer
texts (so a cut that favours the quick ones favours short ones too); ``--hang`` of them hang (RUN
sleeps 600 s) until the batch's RUN limit ``--run-limit-s`` ends them (outcome ``timeout``).

- ``no_deadline``: ``--steps`` batches, each read to its end (``results``), as a trainer does today;
- ``quorum``: ``--steps`` batches with ``quorum={"min_fraction": F, "rest": "carry"}``, each read with
  ``step`` and a ``CarryCursor``: the step returns once F of the batch finished, and every carried job
  is delivered at a later step; after the last step the cursor is read until the last carried job.

Figures: wait per step (mean, from submit to the step in hand) each way; the 95th percentile job time
(submit to finish, over the no-deadline jobs that did not hang: each step's, averaged; a warm-up batch
runs first); ``ratio_to_p95`` = quorum wait /
p95 (target <= 1.2); jobs never delivered (``lost``) or delivered twice (``duplicated``) over all the
quorum steps (target 0 and 0); the mean trajectory length of the carried jobs, of the jobs trained on
(each step's plus the carried ones) and of the whole pool (target: trained == pool within noise).
"""

from __future__ import annotations

import argparse
import math
import random
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench._common import REDIS, emit, flushed_redis, fresh_database, stack_settings  # noqa: E402
from farm.client import CarryCursor, FarmClient, JobResult  # noqa: E402
from farm.embedded import EmbeddedStack  # noqa: E402

HANG_S = 600.0
ALPHABET = "abcdefghijklmnopqrstuvwxyz "


def make_step(args: argparse.Namespace, rng: random.Random, step: int) -> list[dict[str, Any]]:
    tasks = []
    for i in range(args.jobs):
        length = rng.randint(16, 400)
        text = "".join(rng.choice(ALPHABET) for _ in range(length))
        run_s = min(rng.lognormvariate(math.log(args.median_s), args.sigma) * (0.5 + length / 416), 60.0)
        if rng.random() < args.hang:
            run_s = HANG_S
        tasks.append(
            {
                "type": "echo",
                "name": f"s{step}-{i}",
                "config": {"text": text, "sleep_s": {"init": 0.02, "run": round(run_s, 3), "eval": 0.02}},
            }
        )
    return tasks


def job_seconds(result: JobResult) -> float | None:
    job = result.job
    if job.finished_at is None:
        return None
    return (job.finished_at - job.created_at).total_seconds()


def length(result: JobResult) -> int | None:
    return None if result.trajectory is None else result.trajectory.num_tokens


def percentile(values: list[float], share: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, math.ceil(share * len(ordered)) - 1))]


def warm_up(farm: FarmClient, args: argparse.Namespace) -> None:
    """One batch of instant jobs first: the pools' threads and connections start outside the figures."""
    batch = farm.submit([{"type": "echo", "config": {"text": f"warm {i}"}} for i in range(args.jobs)])
    list(farm.results(batch.id, encoding="json", trajectories=False, wait_s=30))


def no_deadline(
    farm: FarmClient, args: argparse.Namespace, limits: dict[str, float]
) -> tuple[list[float], list[float]]:
    """Each step read to its end; returns the waits and each step's 95th percentile job time."""
    rng = random.Random(args.seed)
    waits, p95s = [], []
    for step in range(args.steps):
        tasks = make_step(args, rng, step)
        hung = {t["name"] for t in tasks if t["config"]["sleep_s"]["run"] == HANG_S}
        start = time.perf_counter()
        batch = farm.submit(tasks, limits=limits)
        results = list(farm.results(batch.id, encoding="json", wait_s=30))
        waits.append(time.perf_counter() - start)
        names = {j: tasks[i]["name"] for i, j in enumerate(batch.job_ids)}
        times = [s for r in results if names[r.job.id] not in hung and (s := job_seconds(r)) is not None]
        p95s.append(percentile(times, 0.95))
        print(f"no_deadline step {step}: {waits[-1]:.1f}s, {len(results)} jobs, p95 job {p95s[-1]:.1f}s", flush=True)
    return waits, p95s


def quorum(farm: FarmClient, args: argparse.Namespace, limits: dict[str, float]) -> dict[str, Any]:
    rng = random.Random(args.seed)
    carry = CarryCursor()
    waits: list[float] = []
    submitted: set[int] = set()
    delivered: list[int] = []
    trained: list[int] = []
    carried_lengths: list[int] = []
    pool_lengths: list[int] = []
    carried_count = 0
    for step in range(args.steps):
        tasks = make_step(args, rng, step)
        # An echo's trajectory: bos, the text, sep (the prompt), then the text again and eos.
        pool_lengths += [2 * len(t["config"]["text"]) + 3 for t in tasks]
        start = time.perf_counter()
        batch = farm.submit(tasks, limits=limits, quorum={"min_fraction": args.fraction, "rest": "carry"})
        got = farm.step(batch.id, carry, wait_s=30)
        waits.append(time.perf_counter() - start)
        submitted |= set(batch.job_ids)
        status = farm.status(batch.id)
        carried_count += status.readiness.carried if status.readiness else 0
        for r in got.results + got.carried:
            delivered.append(r.job.id)
            if (n := length(r)) is not None:
                trained.append(n)
        carried_lengths += [n for r in got.carried if (n := length(r)) is not None]
        print(
            f"quorum step {step}: {waits[-1]:.1f}s ({got.ready_reason}), {len(got.results)} + {len(got.carried)} "
            f"carried in",
            flush=True,
        )
    # After the last step: the carried jobs still running are read as they end (the hung ones at the limit).
    deadline = time.monotonic() + args.run_limit_s + 60
    while carry.pending and time.monotonic() < deadline:
        time.sleep(1.0)
        late = farm.carried(carry)
        delivered += [r.job.id for r in late]
        trained += [n for r in late if (n := length(r)) is not None]
        carried_lengths += [n for r in late if (n := length(r)) is not None]
    return {
        "waits": waits,
        "carried": carried_count,
        "lost": len(submitted - set(delivered)),
        "duplicated": len(delivered) - len(set(delivered)),
        "carried_mean_len": statistics.fmean(carried_lengths) if carried_lengths else None,
        "trained_mean_len": statistics.fmean(trained),
        "pool_mean_len": statistics.fmean(pool_lengths),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--jobs", type=int, default=512)
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--hang", type=float, default=0.01)
    parser.add_argument("--fraction", type=float, default=0.95)
    parser.add_argument("--median-s", type=float, default=1.0)
    parser.add_argument("--sigma", type=float, default=0.6)
    parser.add_argument("--run-limit-s", type=float, default=20.0)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    limits = {"run_s": args.run_limit_s}
    with (
        tempfile.TemporaryDirectory(prefix="farm-bench-stragglers-") as tmp,
        fresh_database() as db,
        flushed_redis(REDIS) as redis_url,
    ):
        concurrency = {"init": 64, "run": args.jobs + 64, "eval": 64}
        settings = stack_settings(Path(tmp), redis_url=redis_url, database_url=db, concurrency=concurrency)
        settings = settings.model_copy(
            update={"worker": settings.worker.model_copy(update={"limit_grace_s": 1.0, "sweep_interval_s": 1.0})}
        )
        with (
            EmbeddedStack(settings, with_flower=False, with_llm=False) as stack,
            FarmClient(stack.settings.api_url, token="bench", timeout_s=120) as farm,
        ):
            warm_up(farm, args)
            base_waits, p95s = no_deadline(farm, args, limits)
            q = quorum(farm, args, limits)
    p95 = statistics.fmean(p95s)
    wait_quorum = statistics.fmean(q["waits"])
    out = {
        "wait_no_deadline_s": round(statistics.fmean(base_waits), 2),
        "wait_quorum_s": round(wait_quorum, 2),
        "p95_job_s": round(p95, 2),
        "ratio_to_p95": round(wait_quorum / p95, 3),
        "carried": q["carried"],
        "lost": q["lost"],
        "duplicated": q["duplicated"],
        "carried_mean_len": None if q["carried_mean_len"] is None else round(q["carried_mean_len"], 1),
        "trained_mean_len": round(q["trained_mean_len"], 1),
        "pool_mean_len": round(q["pool_mean_len"], 1),
    }
    emit(out)


if __name__ == "__main__":
    main()
