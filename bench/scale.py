"""Scale-out: N simulated nodes on one API, one PostgreSQL and one Redis, with and without PgBouncer.

    python bench/scale.py [--nodes 1,2,4,8,16] [--jobs-per-node 40] [--modes direct,pgbouncer]

A node is what ``slurm/node.sbatch`` starts: three worker processes (``farm worker -Q init``, ``-Q run``,
``-Q eval``, default slots 4/32/2) with a node name of their own. Jobs are ``echo`` with stage sleeps
0.2/1.0/0.3 s, so a node's bound is its 2 EVAL slots / 0.3 s = 6.67 jobs/s, and one batch of
``jobs-per-node`` x N jobs can finish no sooner than init + run + jobs x eval / 2 (the ``ideal``).
PostgreSQL is a cluster of the bench's own (Debian's default ``max_connections`` 100, fsync off,
``pg_stat_statements``), Redis the one given (its command counters are reset: give the bench a Redis
of its own). Per N it prints one JSON line: jobs/s, against N x the node's bound and the ideal, the
efficiency against 1 node of the same mode, the most PostgreSQL connections to the farm's database
(and, behind PgBouncer, its client connections), statements, WAL bytes and Redis commands per job,
and CPU milliseconds per job of each process kind (the API, the init/run/eval workers, PostgreSQL,
Redis, PgBouncer) with the machine's CPU busy fraction: where that nears 1.0 (2 cores), this
machine's CPU, not the farm, is what stops the curve. The last line sums it up.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psutil
import redis
import sqlalchemy as sa

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench._common import REDIS, emit, flushed_redis, stack_settings  # noqa: E402
from farm.client import FarmClient  # noqa: E402
from farm.config import Settings  # noqa: E402
from farm.db.budget import deployment  # noqa: E402
from farm.embedded import EmbeddedStack  # noqa: E402
from farm.metrics import read_workers  # noqa: E402
from farm.testing import temporary_database  # noqa: E402
from farm.testing.pgbouncer import PgBouncer, private_pgbouncer  # noqa: E402
from farm.testing.postgres import private_postgres  # noqa: E402

SLEEPS = {"init": 0.2, "run": 1.0, "eval": 0.3}
SLOTS = {"init": 4, "run": 32, "eval": 2}
NODE_BOUND = min(SLOTS[s] / SLEEPS[s] for s in SLEEPS)
#: PgBouncer's server connections for the farm's database (2-4 per PostgreSQL core is the usual advice).
BOUNCER_POOL = 20
KINDS = ("api", "init", "run", "eval")
#: Debian's default: the farm's processes share it with the bench's one connection.
MAX_CONNECTIONS = 100
#: no-sleep echo jobs per node run before each timed batch, untimed.
WARMUP_PER_NODE = 8
#: seconds of idle CPU measured before each batch.
IDLE_S = 3.0


def ideal_seconds(jobs: int) -> float:
    """The soonest one node's batch of ``jobs`` can end: the first job's INIT and RUN, then EVAL-bound."""
    return SLEEPS["init"] + SLEEPS["run"] + jobs * SLEEPS["eval"] / SLOTS["eval"]


def cpu_s(process: psutil.Process) -> float:
    total = 0.0
    for p in [process, *process.children(recursive=True)]:
        with contextlib.suppress(psutil.Error):
            times = p.cpu_times()
            total += times.user + times.system
    return total


class Sampler:
    """Every 0.25 s while a batch runs: connections to the farm's database at the server, and
    PgBouncer's clients of it; CPU of the server's backends (they live as long as the pools)."""

    def __init__(self, admin: sa.Connection, database: str, bouncer: PgBouncer | None) -> None:
        self.pg_max = self.clients_max = 0
        self.backend_cpu: dict[int, float] = {}
        self._admin, self._database, self._bouncer = admin, database, bouncer
        #: what the backends already open (the API's, PgBouncer's) had used before the batch.
        self._before = {pid: cpu for pid, cpu in self._backends()}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, daemon=True)
        self._thread.start()

    def _backends(self) -> list[tuple[int, float]]:
        query = sa.text("select pid from pg_stat_activity where datname = :d and pid <> pg_backend_pid()")
        pids = list(self._admin.execute(query, {"d": self._database}).scalars())
        out = []
        for pid in pids:
            with contextlib.suppress(psutil.Error):
                times = psutil.Process(pid).cpu_times()
                out.append((pid, times.user + times.system))
        return out

    @property
    def postgres_cpu_s(self) -> float:
        return sum(cpu - self._before.get(pid, 0.0) for pid, cpu in self.backend_cpu.items())

    def _loop(self) -> None:
        while not self._stop.wait(0.25):
            backends = self._backends()
            self.pg_max = max(self.pg_max, len(backends))
            self.backend_cpu.update(backends)
            if self._bouncer is not None:
                pools = [p for p in self._bouncer.show("POOLS") if p["database"] == self._database]
                clients = sum(int(p["cl_active"]) + int(p["cl_waiting"]) for p in pools)
                self.clients_max = max(self.clients_max, clients)

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(10)


def redis_counts(client: redis.Redis) -> tuple[int, float]:
    """Commands served and CPU seconds used by the Redis server so far."""
    stats = client.info("commandstats")
    cpu = client.info("cpu")
    calls = sum(int(v["calls"]) for v in stats.values())
    return calls, float(cpu["used_cpu_user"]) + float(cpu["used_cpu_sys"])


def top_statements(admin: sa.Connection, database: str, jobs: int) -> list[list[Any]]:
    """The three statements run most often, per job, their text cut short."""
    rows = admin.execute(
        sa.text(
            "select calls, regexp_replace(query, '\\s+', ' ', 'g') from pg_stat_statements s"
            " join pg_database d on d.oid = s.dbid where d.datname = :d order by calls desc limit 3"
        ),
        {"d": database},
    ).all()
    return [[round(calls / jobs, 2), query[:70]] for calls, query in rows]


def statement_counts(admin: sa.Connection, database: str) -> tuple[int, int]:
    row = admin.execute(
        sa.text(
            "select coalesce(sum(calls), 0), coalesce(sum(wal_bytes), 0) from pg_stat_statements s"
            " join pg_database d on d.oid = s.dbid where d.datname = :d"
        ),
        {"d": database},
    ).one()
    return int(row[0]), int(row[1])


def node_settings(base: Settings, data_dir: Path, node: str) -> Settings:
    return base.model_copy(
        update={"data_dir": data_dir, "worker": base.worker.model_copy(update={"node": node})}, deep=True
    )


def add_nodes(nodes: list[EmbeddedStack], base: Settings, root: Path, n: int, redis_client: redis.Redis) -> None:
    """Grow ``nodes`` to ``n`` nodes (the ones running stay: a worker takes a few seconds of CPU to
    start), and wait until every worker process has reported in."""
    for k in range(len(nodes), n):
        name = f"{root.name}-node{k}"
        stack = EmbeddedStack(node_settings(base, root / name, name), with_flower=False)
        stack.log_dir.mkdir(parents=True, exist_ok=True)
        for stage in SLOTS:
            stack.spawn(stage, ["worker", "--queues", stage])
        nodes.append(stack)
    deadline = time.monotonic() + 600
    while sum(w.node.startswith(f"{root.name}-node") for w in read_workers(redis_client)) < 3 * n:
        failed = [s for stack in nodes for s in stack.failed()]
        if failed:
            raise RuntimeError(f"{failed[0].name} exited: {nodes[0].tail(failed[0])}")
        if time.monotonic() > deadline:
            raise TimeoutError(f"the workers of {n} nodes did not all report within 600 s")
        time.sleep(0.5)


def one_n(
    *,
    nodes: list[EmbeddedStack],
    jobs_per_node: int,
    mode: str,
    api: EmbeddedStack,
    client: FarmClient,
    admin: sa.Connection,
    database: str,
    bouncer: PgBouncer | None,
    redis_client: redis.Redis,
) -> dict[str, Any]:
    n = len(nodes)
    procs = {"api": [psutil.Process(api.services[0].process.pid)]}
    for kind in SLOTS:
        procs[kind] = [psutil.Process(s.process.pid) for st in nodes for s in st.services if s.name == kind]
    pgbouncer = psutil.Process(bouncer.pid) if bouncer else None
    jobs = n * jobs_per_node
    task = {"type": "echo", "config": {"text": "scale", "sleep_s": SLEEPS}}
    # Untimed: a process's first stages pay for imports and first statements (the API's too).
    warm = client.submit([{"type": "echo", "config": {"text": "warm"}}] * (WARMUP_PER_NODE * n))
    assert sum(1 for _ in client.results(warm.id, page_size=500, wait_s=10)) == WARMUP_PER_NODE * n
    admin.execute(sa.text("select pg_stat_statements_reset()"))
    # What the processes use idle (heartbeats, sweeps, the broker's polls), per process and second.
    idle0 = {kind: sum(cpu_s(p) for p in ps) for kind, ps in procs.items()}
    time.sleep(IDLE_S)
    cpu0 = {kind: sum(cpu_s(p) for p in ps) for kind, ps in procs.items()}
    idle = {kind: 1000 * (cpu0[kind] - idle0[kind]) / IDLE_S / len(procs[kind]) for kind in procs}
    bouncer0 = cpu_s(pgbouncer) if pgbouncer else 0.0
    machine0 = psutil.cpu_times()
    redis0 = redis_counts(redis_client)
    sampler = Sampler(admin, database, bouncer)
    started = time.perf_counter()
    batch = client.submit([task] * jobs)
    done = sum(1 for r in client.results(batch.id, page_size=500, wait_s=10) if r.job.state.value == "done")
    seconds = time.perf_counter() - started
    sampler.stop()
    machine1 = psutil.cpu_times()
    cpu1 = {kind: sum(cpu_s(p) for p in ps) for kind, ps in procs.items()}
    bouncer_cpu = (cpu_s(pgbouncer) if pgbouncer else 0.0) - bouncer0
    calls, redis_cpu = (b - a for a, b in zip(redis0, redis_counts(redis_client), strict=True))
    statements, wal = statement_counts(admin, database)
    top = top_statements(admin, database, jobs)
    assert done == jobs, f"only {done} of {jobs} jobs ended done"
    busy = sum(getattr(machine1, f) - getattr(machine0, f) for f in ("user", "system", "nice", "irq", "softirq"))
    wall = sum(machine1) - sum(machine0)
    rate = jobs / seconds
    per_job_ms = {f"cpu_ms_per_job_{k}": round(1000 * (cpu1[k] - cpu0[k]) / jobs, 2) for k in (*KINDS,)}
    per_job_ms["cpu_ms_per_job_postgres"] = round(1000 * sampler.postgres_cpu_s / jobs, 2)
    per_job_ms["cpu_ms_per_job_redis"] = round(1000 * redis_cpu / jobs, 2)
    if bouncer is not None:
        per_job_ms["cpu_ms_per_job_pgbouncer"] = round(1000 * bouncer_cpu / jobs, 2)
    return {
        "mode": mode,
        "nodes": n,
        "jobs": jobs,
        "seconds": round(seconds, 2),
        "jobs_per_s": round(rate, 2),
        "bound_jobs_per_s": round(n * NODE_BOUND, 2),
        "of_bound": round(rate / (n * NODE_BOUND), 3),
        "of_ideal": round(ideal_seconds(jobs_per_node) / seconds, 3),
        "pg_connections_max": sampler.pg_max,
        **({"pgbouncer_clients_max": sampler.clients_max} if bouncer else {}),
        "statements_per_job": round(statements / jobs, 1),
        "wal_kb_per_job": round(wal / jobs / 1024, 2),
        "redis_commands_per_job": round(calls / jobs, 1),
        **per_job_ms,
        **{f"idle_cpu_ms_per_s_{k}": round(idle[k], 2) for k in KINDS},
        # Cores the farm (its processes, PostgreSQL's backends, Redis, PgBouncer) kept busy.
        "farm_cores": round(
            (sum(cpu1[k] - cpu0[k] for k in KINDS) + sampler.postgres_cpu_s + redis_cpu + bouncer_cpu) / seconds, 2
        ),
        "machine_cpu_busy": round(busy / wall, 3) if wall else None,
        "load_average_1m": round(psutil.getloadavg()[0], 1),
        "top_statements_per_job": top,
    }


@contextlib.contextmanager
def farm_api(
    server_url: str, bouncer: PgBouncer | None, root: Path, redis_url: str
) -> Iterator[tuple[EmbeddedStack, str]]:
    """A migrated database on the private server and the API on it (through PgBouncer if given)."""
    with temporary_database(server_url, prefix="farm_scale") as db:
        url = bouncer.url_of(db) if bouncer else db
        settings = stack_settings(root, redis_url=redis_url, database_url=url, concurrency={s: SLOTS[s] for s in SLOTS})
        behind = {"prepared_statements": False, "startup_options": False} if bouncer else {}
        settings = settings.model_copy(
            update={
                "database": settings.database.model_copy(update=behind),
                "worker": settings.worker.model_copy(update={"check_sandbox": False}),
            },
            deep=True,
        )
        stack = EmbeddedStack(settings, with_flower=False, with_llm=False, stages=())
        stack.start()
        try:
            yield stack, str(sa.make_url(db).database)
        finally:
            stack.stop()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--nodes", default="1,2,4,8,16")
    parser.add_argument("--jobs-per-node", type=int, default=40)
    parser.add_argument("--modes", default="direct,pgbouncer")
    parser.add_argument("--redis", default=REDIS, help="a Redis database the bench may flush (its counters are reset)")
    args = parser.parse_args()
    counts = [int(n) for n in args.nodes.split(",")]
    lines: list[dict[str, Any]] = []
    options = {"max_connections": str(MAX_CONNECTIONS), "shared_preload_libraries": "pg_stat_statements"}
    with private_postgres(options) as server, tempfile.TemporaryDirectory() as tmp:
        # One connection held for the whole run: at 16 nodes without PgBouncer the farm fills the server.
        engine = sa.create_engine(server, poolclass=sa.pool.NullPool, isolation_level="AUTOCOMMIT")
        admin = engine.connect()
        admin.execute(sa.text("create extension if not exists pg_stat_statements"))
        for mode in args.modes.split(","):
            bouncing = private_pgbouncer(server, pool_size=BOUNCER_POOL) if mode == "pgbouncer" else None
            with (
                bouncing or contextlib.nullcontext() as bouncer,
                flushed_redis(args.redis) as redis_url,
                farm_api(server, bouncer, Path(tmp) / mode, redis_url) as (api, database),
                FarmClient(api.settings.api_url, token="bench") as client,
            ):
                redis_client = redis.Redis.from_url(redis_url)
                nodes: list[EmbeddedStack] = []
                one = None
                try:
                    for n in counts:
                        budget = deployment(api.settings, n).total
                        if bouncer is None and budget >= MAX_CONNECTIONS:
                            # Pools hold their connections once open: the processes that came last
                            # would wait for one for as long as the others live.
                            reason = f"budget {budget} connections > max_connections {MAX_CONNECTIONS}"
                            lines.append({"mode": mode, "nodes": n, "skipped": reason})
                            print(json.dumps(lines[-1]), flush=True)
                            continue
                        add_nodes(nodes, api.settings, Path(tmp) / mode, n, redis_client)
                        line = one_n(
                            nodes=nodes,
                            jobs_per_node=args.jobs_per_node,
                            mode=mode,
                            api=api,
                            client=client,
                            admin=admin,
                            database=database,
                            bouncer=bouncer,
                            redis_client=redis_client,
                        )
                        one = one or line["jobs_per_s"]
                        line["efficiency"] = round(line["jobs_per_s"] / (n * one), 3)
                        lines.append(line)
                        print(json.dumps(line), flush=True)
                finally:
                    for stack in nodes:
                        stack.stop()
                    redis_client.close()
        admin.close()
        engine.dispose()
    emit(summary(lines))


def summary(lines: list[dict[str, Any]]) -> dict[str, Any]:
    def eff(mode: str, n: int) -> float | None:
        return next((x.get("efficiency") for x in lines if x["mode"] == mode and x["nodes"] == n), None)

    out: dict[str, Any] = {}
    for mode in dict.fromkeys(x["mode"] for x in lines):
        suffix = "" if mode == "direct" else f"_{mode}"
        out[f"efficiency_8{suffix}"] = eff(mode, 8)
        out[f"efficiency_16{suffix}"] = eff(mode, 16)
        out[f"max_pg_connections{suffix}"] = max(x.get("pg_connections_max", 0) for x in lines if x["mode"] == mode)
    return out


if __name__ == "__main__":
    main()
