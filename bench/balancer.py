"""Balancer benchmark: acquire+release latency and throughput, and load imbalance under random traffic.

    python bench/balancer.py            # Redis from FARM_BENCH_REDIS_URL, default redis://127.0.0.1:6379/6

The database is flushed first. The last line is JSON:
- acquire_release_p50_ms / _p99_ms: one new job's acquire plus its release, one client, sequential.
- bare_script_p50_ms: the floor, one EVALSHA of a trivial script (``return 1``) on the same Redis
  from the same client, timed alternately with the pairs so both see the same minutes;
  ``ratio_to_bare`` is acquire_release_p50_ms over it (target <= 3: a pair is two script calls).
- acquire_release_per_s: the same, and ``parallel_acquire_release_per_s`` from 4 processes at once.
- redis_us_per_script: Redis's own time per acquire or release script (INFO commandstats, over a
  separate run of pairs, so the bare calls do not count); the rest
  of the client-side figure is the round trip and the client process's scheduling.
- max_imbalance: max - min in-flight jobs over 8 equal backends, sampled after every acquire while 64
  jobs arrive at random and hold their backend for a random number of turns (exponential durations).
- max_imbalance_arrivals_only: the same with arrivals only (no departures in between).
Departures can leave one backend emptier than another, and sticky jobs are never moved to even it
out, so max_imbalance can exceed 1 even though every new job goes to a least-loaded backend; the
placement check (``placement_violations``: a job given a backend busier than the least loaded) is 0.
"""

from __future__ import annotations

import json
import multiprocessing
import os
import random
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import redis  # noqa: E402

from farm.llm.balancer import Balancer  # noqa: E402

REDIS_URL = os.environ.get("FARM_BENCH_REDIS_URL", "redis://127.0.0.1:6379/6")
BACKENDS = 8
LATENCY_ROUNDS = 5000
STATS_ROUNDS = 1000
PARALLEL_PROCS = 4
PARALLEL_ROUNDS = 2000
SIM_EVENTS = 20000
SIM_TARGET_INFLIGHT = 64


def setup(client: redis.Redis) -> Balancer:
    client.flushdb()
    bal = Balancer(client)
    for i in range(BACKENDS):
        bal.add_backend(backend_id=f"b{i}", url=f"http://127.0.0.1:1/{i}", capacity=4)
    return bal


def evalsha_stats(client: redis.Redis) -> tuple[int, int]:
    """(calls, total microseconds) of EVALSHA since the server started (read, never reset)."""
    stats = client.info("commandstats").get("cmdstat_evalsha", {})
    return int(stats.get("calls", 0)), int(stats.get("usec", 0))


def latency(bal: Balancer, client: redis.Redis) -> tuple[list[float], list[float], float]:
    """(acquire+release ms, bare script call ms, pairs per second)."""
    bare_sha = client.script_load("return 1")
    samples, bare = [], []
    spent = 0.0
    for i in range(LATENCY_ROUNDS):
        t = time.perf_counter()
        bal.acquire(f"lat{i}")
        bal.release(f"lat{i}")
        pair = time.perf_counter() - t
        spent += pair
        samples.append(pair * 1000)
        t = time.perf_counter()
        client.evalsha(bare_sha, 0)
        bare.append((time.perf_counter() - t) * 1000)
    return samples, bare, LATENCY_ROUNDS / spent


def _worker(worker: int) -> None:
    bal = Balancer(redis.Redis.from_url(REDIS_URL))
    for i in range(PARALLEL_ROUNDS):
        bal.acquire(f"p{worker}-{i}")
        bal.release(f"p{worker}-{i}")


def parallel() -> float:
    ctx = multiprocessing.get_context("spawn")
    procs = [ctx.Process(target=_worker, args=(w,)) for w in range(PARALLEL_PROCS)]
    start = time.perf_counter()
    for p in procs:
        p.start()
    for p in procs:
        p.join()
    return PARALLEL_PROCS * PARALLEL_ROUNDS / (time.perf_counter() - start)


def simulate(bal: Balancer, *, departures: bool, rng: random.Random) -> tuple[int, int]:
    """Returns (max imbalance seen after an acquire, placement violations)."""
    live: dict[str, int] = {}  # job -> turns left
    worst = violations = 0
    for n in range(SIM_EVENTS):
        arrive = not departures or len(live) < SIM_TARGET_INFLIGHT or rng.random() < 0.3
        if arrive and (departures or len(live) < BACKENDS * 16):
            loads = {b.id: b.inflight for b in bal.backends()}
            job = f"sim{departures}-{n}"
            chosen = bal.acquire(job).backend_id
            violations += loads[chosen] > min(loads.values())
            live[job] = max(1, int(rng.expovariate(1 / 8)))
            after = [b.inflight for b in bal.backends()]
            worst = max(worst, max(after) - min(after))
        elif live:
            job = rng.choice(list(live))
            bal.acquire(job)  # another turn of a running job: sticky, no new load
            live[job] -= 1
            if live[job] == 0:
                del live[job]
                bal.release(job)
    for job in live:
        bal.release(job)
    return worst, violations


def main() -> None:
    client = redis.Redis.from_url(REDIS_URL)
    bal = setup(client)
    before = evalsha_stats(client)
    for i in range(STATS_ROUNDS):
        bal.acquire(f"stats{i}")
        bal.release(f"stats{i}")
    # Time Redis itself spends per script call: unaffected by how the client process is scheduled.
    after = evalsha_stats(client)
    script_us = round((after[1] - before[1]) / max(1, after[0] - before[0]), 1)
    samples, bare, per_s = latency(bal, client)
    par_per_s = parallel()
    rng = random.Random(0)
    imbalance, violations = simulate(bal, departures=True, rng=rng)
    arrivals_only, violations_arr = simulate(setup(client), departures=False, rng=rng)
    counts = [b.inflight for b in bal.backends()]
    q = statistics.quantiles(samples, n=100)
    result = {
        "acquire_release_p50_ms": round(statistics.median(samples), 4),
        "acquire_release_p99_ms": round(q[98], 4),
        "bare_script_p50_ms": round(statistics.median(bare), 4),
        "ratio_to_bare": round(statistics.median(samples) / statistics.median(bare), 2),
        "acquire_release_per_s": round(per_s),
        "redis_us_per_script": script_us,
        "parallel_acquire_release_per_s": round(par_per_s),
        "max_imbalance": imbalance,
        "max_imbalance_arrivals_only": arrivals_only,
        "placement_violations": violations + violations_arr,
        "leaked_inflight": sum(counts),
        "backends": BACKENDS,
    }
    print(f"balancer: {LATENCY_ROUNDS} acquire+release pairs, {PARALLEL_PROCS} processes x {PARALLEL_ROUNDS}")
    print(f"random traffic: {SIM_EVENTS} events over {BACKENDS} backends")
    client.flushdb()
    print(json.dumps(result))


if __name__ == "__main__":
    main()
