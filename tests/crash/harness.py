"""The pieces of a crash test: a PostgreSQL and a Redis of the test's own that can be stopped and
restarted, a farm of real processes (`python -m farm api|worker|llm serve`) started through
``farm.embedded.EmbeddedStack`` one stack per node, a results reader that resumes from its
cursor across outages, and the checks every scenario ends with.

Processes are started in sessions of their own and killed by process group; ``Farm.stop`` and
the servers' ``stop`` report any process that survives them.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from collections.abc import Callable, Collection
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import sqlalchemy as sa

from farm.client import FarmClient
from farm.config import Settings
from farm.constants import JobState
from farm.embedded import EmbeddedStack, Service, settings_env
from farm.errors import ApiError
from farm.testing.postgres import pg_binary
from tests.integration.conftest import free_port, stack_settings

TOKEN = "e2e-token"
#: how long a restarted server or API gets to answer again.
READY_TIMEOUT_S = 60.0


def _as_postgres(args: list[str], **kwargs: Any) -> subprocess.CompletedProcess[str]:
    """``initdb`` and ``pg_ctl`` refuse to run as root: run them as the ``postgres`` user."""
    if os.geteuid() == 0:
        args = ["runuser", "-u", "postgres", "--", *args]
    return subprocess.run(args, check=True, capture_output=True, text=True, **kwargs)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    # A zombie is dead; only its parent's wait is missing.
    with contextlib.suppress(OSError):
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    return False


@dataclass
class PrivatePostgres:
    """A throwaway PostgreSQL cluster on a free port, in a temp dir the postgres user owns.

    fsync is off (the machine never crashes here, only processes do: what PostgreSQL wrote is in
    the kernel's page cache), but synchronous_commit stays on: with it off, ``stop -m immediate``
    drops commits already acknowledged, a job's finish the API had streamed came back unfinished,
    and it was streamed a second time at another position."""

    port: int = field(default_factory=free_port)
    root: Path | None = None

    @property
    def data_dir(self) -> Path:
        assert self.root is not None
        return self.root / "data"

    @property
    def url(self) -> str:
        return f"postgresql+psycopg://postgres@127.0.0.1:{self.port}/postgres"

    def init(self) -> None:
        self.root = Path(tempfile.mkdtemp(prefix="farm-crash-pg-"))
        shutil.chown(self.root, "postgres", "postgres")
        _as_postgres([pg_binary("initdb"), "-D", str(self.data_dir), "-U", "postgres", "--auth=trust", "--no-sync"])
        options = {
            "listen_addresses": "127.0.0.1",
            "port": str(self.port),
            "unix_socket_directories": str(self.root),
            "fsync": "off",
            "full_page_writes": "off",
            "max_connections": "300",
        }
        with open(self.data_dir / "postgresql.conf", "a") as conf:
            conf.writelines(f"{key} = '{value}'\n" for key, value in options.items())
        self.start()

    def start(self) -> None:
        log = self.root / "server.log" if self.root else None
        _as_postgres([pg_binary("pg_ctl"), "-D", str(self.data_dir), "-l", str(log), "-w", "-t", "60", "start"])

    def stop_immediate(self) -> None:
        """``pg_ctl stop -m immediate``: no checkpoint, clients cut off, crash recovery at the next start."""
        _as_postgres([pg_binary("pg_ctl"), "-D", str(self.data_dir), "-m", "immediate", "-w", "stop"])

    def postmaster_pid(self) -> int | None:
        with contextlib.suppress(OSError, ValueError, IndexError):
            return int((self.data_dir / "postmaster.pid").read_text().split()[0])
        return None

    def destroy(self) -> list[str]:
        """Stop the cluster and delete it; returns the processes that survived (none expected)."""
        if self.root is None:
            return []
        pid = self.postmaster_pid()
        if pid is not None and _alive(pid):
            with contextlib.suppress(subprocess.CalledProcessError):
                self.stop_immediate()
        leftovers = [f"postgres postmaster {pid}"] if pid is not None and _alive(pid) else []
        shutil.rmtree(self.root, ignore_errors=True)
        self.root = None
        return leftovers


@dataclass
class PrivateRedis:
    """``redis-server`` with no persistence on a free port: a restart brings it back empty."""

    log_path: Path
    port: int = field(default_factory=free_port)
    process: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def start(self) -> None:
        binary = shutil.which("redis-server") or "/usr/bin/redis-server"
        args = [binary, "--port", str(self.port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no"]
        with open(self.log_path, "ab") as log:
            self.process = subprocess.Popen(args, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        import redis

        client = redis.Redis.from_url(self.url)
        try:
            wait_for(lambda: _pings(client), timeout_s=READY_TIMEOUT_S, what=f"redis-server on {self.port}")
        finally:
            client.close()

    def kill(self) -> None:
        if self.process is not None and self.process.poll() is None:
            os.killpg(self.process.pid, signal.SIGKILL)
            self.process.wait()

    def restart_empty(self) -> None:
        self.kill()
        self.start()

    def stop(self) -> list[str]:
        pid = self.process.pid if self.process else None
        self.kill()
        return [f"redis-server {pid}"] if pid is not None and _alive(pid) else []


def _pings(client: Any) -> bool:
    try:
        return bool(client.ping())
    except Exception:  # noqa: BLE001 - not up yet
        return False


def wait_for(predicate: Callable[[], bool], *, timeout_s: float, what: str, poll_s: float = 0.2) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if predicate():
            return
        time.sleep(poll_s)
    raise AssertionError(f"timed out after {timeout_s}s waiting for {what}")


def crash_settings(
    data_dir: Path,
    *,
    redis_url: str,
    database_url: str,
    node: str,
    api_port: int,
    model_dir: Path | None = None,
    **worker: Any,
) -> Settings:
    """The integration suite's stack settings, with short leases and the worker knobs a scenario sets
    (e.g. ``node_lost_s``, ``on_node_lost``: settings a farm without them ignores)."""
    settings = stack_settings(data_dir, redis_url=redis_url, database_url=database_url, model_dir=model_dir, node=node)
    worker = {"lease_s": 3.0, "sweep_interval_s": 0.5, **worker}
    data = settings.model_dump(mode="json")
    data["worker"].update(worker)
    data["api"].update({"port": api_port, "token": TOKEN})
    return Settings.model_validate(data)


def migrate(settings: Settings) -> None:
    """``farm migrate`` as an operator runs it, against ``FARM_DATABASE__URL``."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("FARM_")}
    env.update(settings_env(settings))
    subprocess.run([sys.executable, "-m", "farm", "migrate"], env=env, check=True, capture_output=True)


@dataclass
class Proc:
    """One farm process the test may kill and start again."""

    name: str
    stack: EmbeddedStack
    args: list[str]
    service: Service | None = None

    @property
    def alive(self) -> bool:
        return self.service is not None and self.service.process.poll() is None


@dataclass
class Farm:
    """A farm of real processes: one ``EmbeddedStack`` (settings, logs, spawn) per node."""

    stacks: dict[str, EmbeddedStack]
    procs: dict[str, Proc] = field(default_factory=dict)
    faults: Counter[str] = field(default_factory=Counter)
    pgids: set[int] = field(default_factory=set)

    @classmethod
    def create(
        cls,
        data_dir: Path,
        *,
        nodes: list[str],
        redis_url: str,
        database_url: str,
        model_dir: Path | None = None,
        **worker: Any,
    ) -> Farm:
        api_port = free_port()
        stacks = {}
        for node in nodes:
            settings = crash_settings(
                data_dir / node,
                redis_url=redis_url,
                database_url=database_url,
                node=node,
                api_port=api_port,
                model_dir=model_dir,
                **worker,
            )
            settings.data_dir.mkdir(parents=True, exist_ok=True)
            (settings.data_dir / "logs").mkdir(exist_ok=True)
            stacks[node] = EmbeddedStack(settings, with_flower=False, with_llm=False)
        farm = cls(stacks)
        migrate(farm.settings)
        return farm

    @property
    def settings(self) -> Settings:
        return next(iter(self.stacks.values())).settings

    @property
    def api_url(self) -> str:
        return self.settings.api_url

    def client(self, **kwargs: Any) -> FarmClient:
        return FarmClient(self.api_url, token=TOKEN, **kwargs)

    def add(self, name: str, args: list[str], *, node: str | None = None) -> Proc:
        proc = Proc(name, self.stacks[node or next(iter(self.stacks))], args)
        self.procs[name] = proc
        self.start(proc)
        return proc

    def add_worker(self, node: str, stage: str, index: int) -> Proc:
        return self.add(f"{node}-{stage}-{index}", ["worker", "--queues", stage, "--loglevel", "INFO"], node=node)

    def start(self, proc: Proc) -> None:
        proc.service = proc.stack.spawn(proc.name, proc.args)
        self.pgids.add(proc.service.process.pid)

    def kill(self, proc: Proc, *, kind: str) -> None:
        """SIGKILL the process group (no clean-up), reap it, count the fault."""
        assert proc.service is not None
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.service.process.pid, signal.SIGKILL)
        proc.service.process.wait()
        self._forget(proc)
        self.faults[kind] += 1

    def _forget(self, proc: Proc) -> None:
        # The stack's readiness check treats any dead service as a failure: drop the reaped one.
        with contextlib.suppress(ValueError):
            proc.stack.services.remove(proc.service)  # type: ignore[arg-type]

    def restart(self, proc: Proc) -> None:
        self.start(proc)

    def revive_exited(self, *, keep_dead: Collection[str] = frozenset()) -> list[str]:
        """Start again any process that exited on its own (a supervisor's job); names those."""
        revived = []
        for proc in self.procs.values():
            if proc.name in keep_dead or proc.service is None or proc.service.process.poll() is None:
                continue
            self._forget(proc)
            self.faults["exited_by_itself"] += 1
            self.start(proc)
            revived.append(proc.name)
        return revived

    def wait_api(self, timeout_s: float = READY_TIMEOUT_S) -> None:
        def ready() -> bool:
            try:
                return httpx.get(f"{self.api_url}/readyz", timeout=2).status_code == 200
            except httpx.HTTPError:
                return False

        wait_for(ready, timeout_s=timeout_s, what=f"{self.api_url}/readyz")

    def log_tails(self, lines: int = 15) -> str:
        out = []
        for proc in self.procs.values():
            if proc.service is not None:
                out.append(f"--- {proc.name}\n{proc.stack.tail(proc.service, lines)}")
        return "\n".join(out)

    def stop(self) -> list[str]:
        """Stop every process (SIGTERM, then SIGKILL); returns the process groups that survived."""
        for stack in self.stacks.values():
            stack.stop()
        for pgid in self.pgids:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(pgid, signal.SIGKILL)
        time.sleep(0.2)
        return [f"process group {pgid}" for pgid in sorted(self.pgids) if _group_alive(pgid)]


def _group_alive(pgid: int) -> bool:
    for stat in Path("/proc").glob("[0-9]*/stat"):
        with contextlib.suppress(OSError, IndexError):
            fields = stat.read_text().rsplit(")", 1)[1].split()
            if fields[0] != "Z" and int(fields[2]) == pgid:
                return True
    return False


@dataclass
class ResultsReader:
    """Reads a batch's results with ``FarmClient.results`` as a trainer would, resuming from the
    last ``seq`` it saw whenever the API is unreachable or answers 5xx (API restart, database down)."""

    farm: Farm
    batch_id: int
    total: int
    results: list[Any] = field(default_factory=list)
    reconnects: int = 0
    errors: Counter[str] = field(default_factory=Counter)
    _stop: threading.Event = field(default_factory=threading.Event)
    _thread: threading.Thread | None = None

    @property
    def cursor(self) -> int:
        return self.results[-1].seq if self.results else 0

    @property
    def done(self) -> bool:
        return len(self.results) >= self.total

    def start(self) -> ResultsReader:
        self._thread = threading.Thread(target=self._loop, name="crash-results", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=30)

    def _loop(self) -> None:
        while not self._stop.is_set() and not self.done:
            try:
                with self.farm.client(timeout_s=10) as client:
                    for result in client.results(self.batch_id, after=self.cursor, wait_s=2, encoding="json"):
                        self.results.append(result)
                        if self._stop.is_set():
                            return
                    if self.done:
                        return
            except (httpx.HTTPError, ApiError) as exc:
                if isinstance(exc, ApiError) and exc.status < 500:
                    raise
                self.errors[type(exc).__name__] += 1
            self.reconnects += 1
            self._stop.wait(0.5)


def batch_rows(database_url: str, batch_id: int) -> tuple[list[dict[str, Any]], dict[int, int], dict[str, Any]]:
    """The batch's jobs, trajectories per job and batch row, straight from PostgreSQL."""
    engine = sa.create_engine(database_url)
    try:
        with engine.connect() as conn:
            jobs = [
                dict(row._mapping)
                for row in conn.execute(
                    sa.text(
                        "select id, state, outcome, reason, node, stage_done, finish_seq, finished_at"
                        " from jobs where batch_id = :b order by id"
                    ),
                    {"b": batch_id},
                )
            ]
            trajs: dict[int, int] = dict(
                conn.execute(
                    sa.text(
                        "select t.job_id, count(*) from trajectories t join jobs j on j.id = t.job_id"
                        " where j.batch_id = :b group by t.job_id"
                    ),
                    {"b": batch_id},
                ).all()
            )
            batch = dict(
                conn.execute(
                    sa.text("select state, total_jobs, finished_jobs, created_at from batches where id = :b"),
                    {"b": batch_id},
                )
                .one()
                ._mapping
            )
    finally:
        engine.dispose()
    return jobs, trajs, batch


def stage_runs(database_url: str, batch_id: int) -> Counter[str]:
    """Finished stage attempts of the batch by ``stage:status`` (e.g. ``run:lost``, ``run:retry``)."""
    engine = sa.create_engine(database_url)
    try:
        with engine.connect() as conn:
            rows = conn.execute(
                sa.text(
                    "select s.stage, s.status, count(*) from stage_runs s join jobs j on j.id = s.job_id"
                    " where j.batch_id = :b group by s.stage, s.status"
                ),
                {"b": batch_id},
            ).all()
    finally:
        engine.dispose()
    return Counter({f"{stage}:{status}": int(n) for stage, status, n in rows})


def describe_stuck(jobs: list[dict[str, Any]]) -> str:
    stuck = Counter(
        f"{j['state']}{'/stage_done' if j['stage_done'] else ''}@{j['node']}"
        for j in jobs
        if not JobState(j["state"]).terminal
    )
    return ", ".join(f"{n} in {where}" for where, n in stuck.most_common()) or "none"


def check_batch(database_url: str, batch_id: int, job_ids: list[int], reader: ResultsReader) -> dict[str, Any]:
    """Every job ended exactly once: terminal, one finish_seq each, dense 1..N; one trajectory per
    job that reached RUN's end; the results stream carried each job once in seq order."""
    jobs, trajs, batch = batch_rows(database_url, batch_id)
    n = len(job_ids)
    assert [j["id"] for j in jobs] == sorted(job_ids)
    not_ended = [j for j in jobs if not JobState(j["state"]).terminal]
    assert not not_ended, f"{len(not_ended)} of {n} jobs never ended: {describe_stuck(jobs)}"
    assert sorted(j["finish_seq"] for j in jobs) == list(range(1, n + 1)), "finish_seq must be 1..N, once each"
    assert batch["finished_jobs"] == n and batch["total_jobs"] == n
    assert all(count == 1 for count in trajs.values())
    missing = [j["id"] for j in jobs if j["state"] == JobState.DONE and j["id"] not in trajs]
    assert not missing, f"done jobs without a trajectory: {missing}"
    # The stream: each job once, in finish order, across every reconnect.
    seqs = [r.seq for r in reader.results]
    streamed = [r.job.id for r in reader.results]
    assert len(streamed) == len(set(streamed)), "a job was streamed twice"
    assert seqs == list(range(1, n + 1)), f"stream seqs not dense: {seqs[:5]}..{seqs[-5:]} ({len(seqs)})"
    assert sorted(streamed) == sorted(job_ids)
    by_id = {j["id"]: j for j in jobs}
    for r in reader.results:
        assert r.seq == by_id[r.job.id]["finish_seq"], f"job {r.job.id} streamed at {r.seq}"
        assert (r.trajectory is not None) == (r.job.id in trajs)
    last_end = max(j["finished_at"] for j in jobs)
    attempts = stage_runs(database_url, batch_id)
    return {
        "not_ok_attempts": " ".join(f"{k}={v}" for k, v in sorted(attempts.items()) if not k.endswith(":ok")) or "-",
        "states": Counter(str(j["state"]) for j in jobs),
        "seconds": (last_end - batch["created_at"]).total_seconds(),
        "jobs": jobs,
    }


def summary(name: str, *, jobs: int, faults: Counter[str], seconds: float, extra: str = "") -> str:
    kinds = " ".join(f"{kind}={count}" for kind, count in sorted(faults.items())) or "none"
    line = f"CRASH {name}: jobs={jobs} faults[{kinds}] seconds_to_last_end={seconds:.1f}"
    if extra:
        line += f" {extra}"
    print(line)
    return line
