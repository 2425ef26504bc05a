"""What the farm costs per job: no-op jobs per second through the API, the three queues and
PostgreSQL, next to a bare 3-queue Celery chain on the same Redis, measured in one run.

    python bench/overhead.py [--jobs 600] [--concurrency 4] [--rounds 3]

Both sides get three worker processes (one per queue, threads pool, same concurrency) and the
same delivery settings (acks_late, prefetch 1). The farm side also writes every transition and
the trajectory to PostgreSQL and streams the results back through the API, as a trainer would.
Both stay up for the whole run and take turns, bare then farm, ``--rounds`` times: on a shared
2-core machine one round of either side varies by a third from one minute to the next, and
alternating makes both sides see the same minutes. The figures are the medians of the rounds.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import redis
from celery import chain

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench._common import REDIS, emit, flushed_redis, fresh_database, stack_settings  # noqa: E402
from farm.client import FarmClient  # noqa: E402
from farm.embedded import EmbeddedStack, embedded  # noqa: E402

WARMUP = 20
#: the bare chain's Redis database: the farm's is REDIS's, so each side has its own queues.
BARE_REDIS = REDIS.rsplit("/", 1)[0] + "/11"

#: one timed round: jobs per second for this many jobs.
Round = Callable[[int], float]


@contextlib.contextmanager
def farm_stack(concurrency: int) -> Iterator[tuple[EmbeddedStack, FarmClient]]:
    """The farm side's stack (API, one worker process per queue, a fresh PostgreSQL database, a
    flushed Redis database) and a client of its API."""
    with fresh_database() as db, flushed_redis() as url, tempfile.TemporaryDirectory() as tmp:
        settings = stack_settings(
            Path(tmp),
            redis_url=url,
            database_url=db,
            concurrency={"init": concurrency, "run": concurrency, "eval": concurrency},
        )
        with (
            embedded(settings, with_flower=False, with_llm=False) as stack,
            FarmClient(stack.settings.api_url, token="bench") as client,
        ):
            yield stack, client


def noop_round(client: FarmClient) -> Round:
    """One timed round of no-op jobs: submit them as one batch, stream every result back."""
    task = {"type": "echo", "config": {"text": "noop"}}

    def run(jobs: int) -> float:
        started = time.perf_counter()
        batch = client.submit([task] * jobs)
        results = client.results(batch.id, page_size=500)
        done = sum(1 for r in results if r.job.state.value == "done")
        elapsed = time.perf_counter() - started
        assert done == jobs, f"only {done}/{jobs} jobs finished done"
        return jobs / elapsed

    return run


@contextlib.contextmanager
def farm_side(concurrency: int) -> Iterator[Round]:
    with farm_stack(concurrency) as (_, client):
        run = noop_round(client)
        run(WARMUP)
        yield run


@contextlib.contextmanager
def bare_side(concurrency: int) -> Iterator[Round]:
    with flushed_redis(BARE_REDIS) as url:
        root = str(Path(__file__).resolve().parent.parent)
        env = {**os.environ, "BENCH_BARE_REDIS_URL": url, "PYTHONPATH": root}
        workers = [
            subprocess.Popen(
                [
                    sys.executable,
                    "-m",
                    "celery",
                    "-A",
                    "bench.bare_chain",
                    "worker",
                    "-Q",
                    queue,
                    "-c",
                    str(concurrency),
                    "-P",
                    "threads",
                    "--without-gossip",
                    "--without-mingle",
                    "--without-heartbeat",
                    "-l",
                    "WARNING",
                    "-n",
                    f"{queue}@bench",
                ],
                env=env,
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
            )
            for queue in ("qa", "qb", "qc")
        ]
        try:
            os.environ["BENCH_BARE_REDIS_URL"] = url
            from bench import bare_chain

            counter = redis.Redis.from_url(url)
            finished = 0

            def run(jobs: int) -> float:
                nonlocal finished
                started = time.perf_counter()
                with bare_chain.app.producer_or_acquire() as producer:
                    for i in range(jobs):
                        chain(
                            bare_chain.a.si(i).set(queue="qa"),
                            bare_chain.b.si(i).set(queue="qb"),
                            bare_chain.c.si(i).set(queue="qc"),
                        ).apply_async(producer=producer)
                finished += jobs
                deadline = time.monotonic() + 300
                while int(counter.get(bare_chain.COUNTER) or 0) < finished:
                    if time.monotonic() > deadline:
                        raise TimeoutError("bare chains did not finish")
                    time.sleep(0.005)
                return jobs / (time.perf_counter() - started)

            run(WARMUP)
            yield run
        finally:
            for w in workers:
                w.terminate()
            for w in workers:
                w.wait(timeout=20)


def round_arguments(doc: str) -> argparse.Namespace:
    """``--jobs``, ``--concurrency`` and ``--rounds`` of the no-op job benchmarks."""
    parser = argparse.ArgumentParser(description=doc.split("\n\n")[0])
    parser.add_argument("--jobs", type=int, default=600)
    parser.add_argument("--concurrency", type=int, default=4)
    parser.add_argument("--rounds", type=int, default=3)
    return parser.parse_args()


def main() -> None:
    args = round_arguments(__doc__)
    bare_rates: list[float] = []
    farm_rates: list[float] = []
    with bare_side(args.concurrency) as bare, farm_side(args.concurrency) as farm:
        for i in range(args.rounds):
            bare_rates.append(bare(args.jobs))
            farm_rates.append(farm(args.jobs))
            print(
                f"round {i + 1}: bare {bare_rates[-1]:7.1f} chains/s   farm {farm_rates[-1]:7.1f} jobs/s"
                f"   ratio {farm_rates[-1] / bare_rates[-1]:.2f}",
                flush=True,
            )
    bare_rate, farm_rate = statistics.median(bare_rates), statistics.median(farm_rates)
    print(f"bare 3-queue chain: {bare_rate:8.1f} chains/s (median of {args.rounds})")
    print(f"farm no-op jobs:    {farm_rate:8.1f} jobs/s   ({args.jobs} jobs, API + 3 queues + PostgreSQL)")
    print(f"ratio farm/bare:    {farm_rate / bare_rate:8.2f}   (target >= 0.5)")
    emit(
        {
            "farm_jobs_per_s": round(farm_rate, 1),
            "bare_chains_per_s": round(bare_rate, 1),
            "ratio": round(farm_rate / bare_rate, 3),
        }
    )


if __name__ == "__main__":
    main()
