"""Soak: many no-op jobs through the whole stack, watching for anything that grows per job.

    python bench/soak.py [--jobs 10000] [--round 500] [--concurrency 4]

The stack is bench/overhead.py's farm side: the API and one worker process per queue as real
processes, a fresh PostgreSQL database, a flushed Redis database. Echo jobs with no sleeps go
through it in rounds of ``--round`` (one batch each, every result streamed back); after a
warm-up round, then after every round, it samples:
- each service's process tree (the ``farm`` process and its children): processes, open file
  descriptors, RSS;
- sandboxes: records in the node's sandbox registry and directories left in its sandbox root;
- database connections: rows of pg_stat_activity for the stack's database;
- Redis clients connected to the stack's Redis database.
The figures are at start (after warm-up), middle and end. A leak shows as growth that goes on
in the second half (``*_growth_second_half``); a cache filling up grows once, early, then stays.
"""

from __future__ import annotations

import argparse
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psutil
import psycopg
import redis
from sqlalchemy.engine import make_url

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench._common import POSTGRES, emit  # noqa: E402
from bench.overhead import WARMUP, farm_stack, noop_round  # noqa: E402
from farm.db.session import libpq_url  # noqa: E402
from farm.embedded import EmbeddedStack  # noqa: E402
from farm.sandbox import sandbox_root  # noqa: E402

#: what a sandbox root holds besides sandboxes.
SANDBOX_ROOT_FILES = {"registry", "scratch"}


@dataclass(frozen=True)
class Tree:
    """One service's process tree at one moment."""

    processes: int
    fds: int
    rss_mb: float


@dataclass(frozen=True)
class Sample:
    jobs: int
    seconds: float
    trees: dict[str, Tree]
    sandboxes: int
    db_connections: int
    redis_clients: int

    @property
    def processes(self) -> int:
        return sum(t.processes for t in self.trees.values())

    @property
    def fds(self) -> int:
        return sum(t.fds for t in self.trees.values())

    @property
    def rss_mb(self) -> float:
        return sum(t.rss_mb for t in self.trees.values())


def tree(root: psutil.Process) -> Tree:
    processes = fds = rss = 0
    for process in [root, *root.children(recursive=True)]:
        try:
            fds += process.num_fds()
            rss += process.memory_info().rss
        except psutil.NoSuchProcess:
            continue
        processes += 1
    return Tree(processes=processes, fds=fds, rss_mb=rss / 2**20)


class Sampler:
    def __init__(self, stack: EmbeddedStack) -> None:
        self.stack = stack
        self.started = time.perf_counter()
        self.database = make_url(stack.settings.database_url).database
        # Sampled from the server's maintenance database, so this connection is not counted.
        self.pg = psycopg.connect(libpq_url(POSTGRES), autocommit=True)
        self.redis = redis.Redis.from_url(stack.settings.redis_url)
        self.redis_db = self.redis.connection_pool.connection_kwargs.get("db", 0)
        self.roots = {s.name: psutil.Process(s.process.pid) for s in stack.services}

    def close(self) -> None:
        self.pg.close()
        self.redis.close()

    def sandboxes(self) -> int:
        root = sandbox_root(self.stack.settings)
        if not root.is_dir():
            return 0
        records = len(list((root / "registry").glob("*.json")))
        dirs = [p for p in root.iterdir() if p.name not in SANDBOX_ROOT_FILES]
        scratch = list((root / "scratch").iterdir()) if (root / "scratch").is_dir() else []
        return records + len(dirs) + len(scratch)

    def db_connections(self) -> int:
        row = self.pg.execute("SELECT count(*) FROM pg_stat_activity WHERE datname = %s", (self.database,)).fetchone()
        return int(row[0]) if row else 0

    def redis_clients(self) -> int:
        me = self.redis.client_id()
        return sum(1 for c in self.redis.client_list() if int(c["db"]) == self.redis_db and int(c["id"]) != me)

    def sample(self, jobs: int) -> Sample:
        return Sample(
            jobs=jobs,
            seconds=time.perf_counter() - self.started,
            trees={name: tree(root) for name, root in self.roots.items()},
            sandboxes=self.sandboxes(),
            db_connections=self.db_connections(),
            redis_clients=self.redis_clients(),
        )


def describe(s: Sample) -> str:
    return (
        f"{s.jobs:6d} jobs {s.seconds:7.1f} s: {s.processes} processes, {s.fds} fds, {s.rss_mb:7.1f} MB RSS, "
        f"{s.sandboxes} sandboxes, {s.db_connections} db connections, {s.redis_clients} redis clients"
    )


def figures(start: Sample, middle: Sample, end: Sample, rates: list[float]) -> dict[str, Any]:
    points = (start, middle, end)
    return {
        "jobs": end.jobs,
        "seconds": round(end.seconds, 1),
        "fd_growth": end.fds - start.fds,
        "fd_growth_second_half": end.fds - middle.fds,
        "rss_growth_mb": round(end.rss_mb - start.rss_mb, 1),
        "rss_growth_second_half_mb": round(end.rss_mb - middle.rss_mb, 1),
        "leaked_sandboxes": end.sandboxes - start.sandboxes,
        "leaked_processes": end.processes - start.processes,
        "db_connections": [p.db_connections for p in points],
        "redis_clients": [p.redis_clients for p in points],
        "jobs_per_s_first_round": round(rates[0], 1),
        "jobs_per_s_last_round": round(rates[-1], 1),
        "per_process": {
            name: {
                "processes": [p.trees[name].processes for p in points],
                "fds": [p.trees[name].fds for p in points],
                "rss_mb": [round(p.trees[name].rss_mb, 1) for p in points],
            }
            for name in start.trees
        },
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--jobs", type=int, default=10_000)
    parser.add_argument("--round", type=int, default=500, help="jobs per batch")
    parser.add_argument("--concurrency", type=int, default=4)
    args = parser.parse_args()
    rounds = [args.round] * (args.jobs // args.round) + ([args.jobs % args.round] if args.jobs % args.round else [])
    with farm_stack(args.concurrency) as (stack, client):
        run = noop_round(client)
        run(WARMUP)
        sampler = Sampler(stack)
        try:
            start = middle = sampler.sample(0)
            print(describe(start), flush=True)
            done = 0
            rates = []
            for size in rounds:
                rates.append(run(size))
                before, done = done, done + size
                sample = sampler.sample(done)
                if before < args.jobs // 2 <= done:
                    middle = sample
                print(f"{describe(sample)}   ({rates[-1]:.1f} jobs/s)", flush=True)
            end = sample
            failed = stack.failed()
            assert not failed, f"services died during the soak: {[s.name for s in failed]}"
        finally:
            sampler.close()
    emit(figures(start, middle, end, rates))


if __name__ == "__main__":
    main()
