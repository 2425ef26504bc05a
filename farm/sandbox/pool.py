"""A node's warm pool: sandboxes started ahead for the specs INIT asks for, handed out at once.

A sandbox start costs ~130 ms here (bwrap, the execution server, its first bash), far more on a
busy node or with a container runtime. The pool starts them before they are asked for. Any spec
works: its *shape* (the spec without ``workspace``, ``snapshot`` and ``label``, which are filled in
at hand-out) names the pool it comes from, so an image, binds, limits or env each make a shape of
their own. A caller that finds its shape empty starts a sandbox itself (cold) and leaves the
shape's spec behind, so the keeper warms it from then on.

Layout under ``<sandbox root>/pool``::

    <key>/spec.json     the shape, written by the first caller that asked for it
    <key>/wanted        its modification time: the last ask (a shape idle for ``pool_idle_s`` is dropped)
    <key>/ready/<ns>-<id>   one empty file per warm, unclaimed sandbox: claiming is unlinking it,
                        which exactly one process on the node wins
    keeper.lock         flock of the one process refilling the pool (another takes over if it dies)

A warm sandbox is an ordinary registry record owned by the keeper's process: if the keeper is
killed, the reaper removes its warm sandboxes like any other dead owner's. It is started with its
lifetime stretched by ``pool_max_age_s`` and replaced once it is that old, and ``adopt`` restarts
its hard lifetime at hand-out.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import logging
import os
import random
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

from farm.config import SandboxSettings
from farm.errors import SandboxError
from farm.sandbox.base import SandboxSpec
from farm.sandbox.server_sandbox import ServerSandbox, resolved_limits

log = logging.getLogger(__name__)

#: fields filled in at hand-out, so not part of a shape.
PER_SANDBOX_FIELDS = frozenset({"workspace", "snapshot", "label"})
#: the nice value sandboxes are started with while they wait in the pool.
REFILL_NICE = 10
#: how often the keeper looks when nothing wakes it.
KEEPER_TICK_S = 0.5


def shape_of(spec: SandboxSpec) -> SandboxSpec:
    return spec.model_copy(update={"workspace": None, "snapshot": None, "label": ""})


def pool_key(spec: SandboxSpec, driver: str) -> str:
    """Which pool serves ``spec``: a hash of its shape and the driver."""
    shape = spec.model_dump(mode="json", exclude=set(PER_SANDBOX_FIELDS))
    blob = json.dumps({"shape": shape, "driver": driver}, sort_keys=True)
    return hashlib.sha256(blob.encode()).hexdigest()[:20]


@dataclass(frozen=True)
class PoolSizing:
    """How many warm sandboxes to keep (from ``SandboxSettings``)."""

    size: int
    minimum: int
    max_total: int
    idle_s: float
    max_age_s: float
    fill_parallel: int

    @classmethod
    def of(cls, settings: SandboxSettings) -> PoolSizing:
        return cls(
            size=settings.pool_size,
            minimum=settings.pool_min,
            max_total=settings.pool_max_total,
            idle_s=settings.pool_idle_s,
            max_age_s=settings.pool_max_age_s,
            fill_parallel=settings.pool_fill_parallel,
        )

    def target(self, demand: int | None) -> int:
        """Warm sandboxes wanted per shape: what the queue holds, within [minimum, size]."""
        if demand is None:
            return self.size
        return max(min(self.size, demand), min(self.minimum, self.size))


class WarmPool:
    """The node's pool directory; ``take`` from any process, ``fill`` from the keeper's."""

    def __init__(
        self,
        *,
        root: Path,
        driver: str,
        settings: SandboxSettings,
        create: Callable[[SandboxSpec], ServerSandbox],
        attach: Callable[[str], ServerSandbox],
    ) -> None:
        self.dir = root / "pool"
        self.dir.mkdir(parents=True, exist_ok=True)
        self.driver = driver
        self.settings = settings
        self.sizing = PoolSizing.of(settings)
        self._create = create
        self._attach = attach
        #: sandboxes this process started for the pool: their Popen reaps the server when it exits.
        self._started: dict[str, ServerSandbox] = {}
        self._lock = threading.Lock()
        #: set by ``take`` so a keeper in this process refills at once.
        self.taken = threading.Event()
        #: set by the keeper's ``stop``: a refill in progress starts nothing more.
        self.stopping = threading.Event()

    # ---- any process ------------------------------------------------------------------------
    def take(self, spec: SandboxSpec) -> ServerSandbox | None:
        """A warm sandbox of ``spec``'s shape, adopted for ``spec``; None when the pool has none
        (the shape is then wanted, so the keeper warms it).

        Raises:
            SandboxUnavailable: the spec's workspace does not fit the warm sandbox's disk quota.
        """
        key = pool_key(spec, self.driver)
        kdir = self.dir / key
        self._want(kdir, spec)
        entries = self._entries(kdir)
        # Callers of a burst try the entries in different orders, so they do not all race for the first.
        random.shuffle(entries)
        for entry in entries:
            try:
                entry.unlink()  # the claim: one process wins each entry
            except FileNotFoundError:
                continue
            sandbox_id = entry.name.partition("-")[2]
            try:
                sandbox = self._attach(sandbox_id)
            except SandboxError:
                continue  # reaped meanwhile (its keeper died)
            try:
                sandbox.adopt(spec)
                _renice(sandbox, 0)
            except BaseException:
                sandbox.close()
                raise
            self.taken.set()
            return sandbox
        self.taken.set()
        return None

    def _want(self, kdir: Path, spec: SandboxSpec) -> None:
        spec_file = kdir / "spec.json"
        if not spec_file.exists():
            (kdir / "ready").mkdir(parents=True, exist_ok=True)
            tmp = kdir / f"spec.json.{os.getpid()}.{threading.get_ident()}"
            tmp.write_text(shape_of(spec).model_dump_json())
            tmp.replace(spec_file)
        wanted = kdir / "wanted"
        try:
            os.utime(wanted)
        except FileNotFoundError:
            wanted.touch()

    def _recorded(self, entry: Path) -> bool:
        return (self.dir.parent / "registry" / f"{entry.name.partition('-')[2]}.json").exists()

    def _stale(self, entry: Path) -> bool:
        """A warm sandbox the reaper removed (its keeper died): its entry goes too."""
        if self._recorded(entry):
            return False
        entry.unlink(missing_ok=True)
        return True

    @staticmethod
    def _entries(kdir: Path) -> list[Path]:
        try:
            return sorted((kdir / "ready").iterdir())  # oldest first: <created ns>-<id>
        except FileNotFoundError:
            return []

    def ready_count(self) -> int:
        return sum(len(self._entries(kdir)) for kdir in self._shapes())

    def _shapes(self) -> list[Path]:
        """This driver's shapes (another driver's keeper on the node warms its own)."""
        out = []
        for kdir in self.dir.iterdir():
            try:
                shape = SandboxSpec.model_validate_json((kdir / "spec.json").read_text())
            except (OSError, ValueError):
                continue
            if pool_key(shape, self.driver) == kdir.name:
                out.append(kdir)
        return out

    # ---- the keeper's process ----------------------------------------------------------------
    def fill(self, demand: int | None = None) -> int:
        """Start what the pool lacks, retire warm sandboxes past ``max_age_s``, drop idle shapes;
        returns how many were started."""
        self._forget_exited()
        now = time.time()
        shapes: list[tuple[Path, SandboxSpec, list[Path], int]] = []
        for kdir in sorted(self._shapes()):
            try:
                asked = (kdir / "wanted").stat().st_mtime
                shape = SandboxSpec.model_validate_json((kdir / "spec.json").read_text())
            except (FileNotFoundError, ValueError):
                continue
            keep = self.sizing.target(demand) if now - asked < self.sizing.idle_s else 0
            entries = [e for e in self._entries(kdir) if not self._stale(e) and not self._retired(e, now)]
            for surplus in entries[keep:]:
                self._retire(surplus)
            shapes.append((kdir, shape, entries[:keep], keep))
        total = sum(len(entries) for _, _, entries, _ in shapes)
        plans: list[tuple[Path, SandboxSpec]] = []
        for kdir, shape, entries, keep in shapes:
            missing = min(keep - len(entries), max(self.sizing.max_total - total, 0))
            total += missing
            plans += [(kdir, shape)] * missing
        if not plans:
            return 0
        with ThreadPoolExecutor(self.sizing.fill_parallel, thread_name_prefix="farm-pool-fill") as ex:
            started = sum(ex.map(lambda plan: self._start_one(*plan), plans))
        return started

    def _retired(self, entry: Path, now: float) -> bool:
        created_ns = int(entry.name.partition("-")[0] or 0)
        if now - created_ns / 1e9 < self.sizing.max_age_s:
            return False
        self._retire(entry)
        return True

    def _retire(self, entry: Path) -> None:
        try:
            entry.unlink()
        except FileNotFoundError:
            return  # handed out meanwhile
        sandbox_id = entry.name.partition("-")[2]
        with self._lock:
            sandbox = self._started.pop(sandbox_id, None)
        with contextlib.suppress(SandboxError):
            (sandbox or self._attach(sandbox_id)).close()

    def _start_one(self, kdir: Path, shape: SandboxSpec) -> bool:
        if self.stopping.is_set():
            return False  # a long refill (100 sandboxes on a busy node) must not outlive stop()
        # Refills run niced (nice is per thread on Linux and children inherit it), so a burst of
        # hand-outs keeps the CPU; ``take`` gives a warm sandbox's processes normal priority back.
        with contextlib.suppress(OSError):
            os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), REFILL_NICE)
        # Its lifetime until hand-out: the shape's, stretched by the longest it may wait warm.
        wall = resolved_limits(shape, self.settings)["wall_time_s"]
        limits = shape.limits.model_copy(update={"wall_time_s": wall + self.sizing.max_age_s if wall else 0})
        spec = shape.model_copy(update={"limits": limits, "label": "warm pool"})
        try:
            sandbox = self._create(spec)
        except Exception:  # noqa: BLE001 - a failed warm start is retried at the next fill
            log.warning("warm pool: could not start a sandbox of %s", kdir.name, exc_info=True)
            return False
        sandbox.detach()
        with self._lock:
            self._started[sandbox.id] = sandbox
        (kdir / "ready").mkdir(parents=True, exist_ok=True)
        (kdir / "ready" / f"{time.time_ns()}-{sandbox.id}").touch()
        return True

    def _forget_exited(self) -> None:
        with self._lock:
            for sandbox_id in [i for i, s in self._started.items() if s.started_here_and_exited()]:
                del self._started[sandbox_id]

    def drain(self) -> int:
        """Close every warm sandbox this process started and nobody took; how many."""
        closed = 0
        for kdir in self._shapes():
            for entry in self._entries(kdir):
                sandbox_id = entry.name.partition("-")[2]
                with self._lock:
                    mine = sandbox_id in self._started
                if mine:
                    self._retire(entry)
                    closed += 1
        self._forget_exited()  # reaps the servers of warm sandboxes handed out and closed since
        return closed


def _renice(sandbox: ServerSandbox, value: int) -> None:
    """Set the priority of every process of the sandbox (its cgroup's members, else its recorded ones)."""
    pids = sandbox._cgroups.pids() or [p.pid for p in sandbox.record.procs]
    for pid in pids:
        with contextlib.suppress(OSError):  # gone meanwhile, or not ours to raise (unprivileged)
            os.setpriority(os.PRIO_PROCESS, pid, value)


class PoolKeeper:
    """Refills the node's pool in a daemon thread, in the one process that holds ``keeper.lock``."""

    def __init__(self, pool: WarmPool, *, demand: Callable[[], int | None] = lambda: None) -> None:
        self.pool = pool
        self.demand = demand
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._lock_fd: int | None = None

    def start(self) -> PoolKeeper:
        self.pool.stopping.clear()
        self._thread = threading.Thread(target=self._loop, name="farm-pool-keeper", daemon=True)
        self._thread.start()
        return self

    def _leader(self) -> bool:
        if self._lock_fd is not None:
            return True
        fd = os.open(self.pool.dir / "keeper.lock", os.O_RDWR | os.O_CREAT, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            return False
        self._lock_fd = fd
        return True

    def _loop(self) -> None:
        while not self._stop.is_set():
            try:
                if self._leader():
                    self.pool.taken.clear()
                    self.pool.fill(self._demand())
            except Exception:  # noqa: BLE001 - a failed round is retried at the next tick
                log.exception("warm pool refill failed")
            self.pool.taken.wait(KEEPER_TICK_S)

    def _demand(self) -> int | None:
        try:
            return self.demand()
        except Exception:  # noqa: BLE001 - without the queue's length the pool keeps its full size
            log.warning("warm pool: cannot read the queue's length", exc_info=True)
            return None

    def stop(self, *, drain: bool = True) -> None:
        """Stop refilling; ``drain`` closes the warm sandboxes this process started."""
        self._stop.set()
        self.pool.stopping.set()
        self.pool.taken.set()
        if self._thread is not None:
            # Only the sandboxes being started now are waited for (each within start_timeout_s).
            self._thread.join()
        if drain:
            self.pool.drain()
        if self._lock_fd is not None:
            os.close(self._lock_fd)
            self._lock_fd = None

    def wait_full(self, *, timeout_s: float) -> bool:
        """Block until the pool holds what ``fill`` aims for (benchmarks, tests)."""
        deadline = time.monotonic() + timeout_s
        target = self.pool.sizing.target(self._demand())
        while time.monotonic() < deadline:
            shapes = self.pool._shapes()
            live = [[e for e in self.pool._entries(k) if self.pool._recorded(e)] for k in shapes]
            if shapes and all(len(entries) >= target for entries in live):
                return True
            time.sleep(0.05)
        return False
