"""What a stage gets to make sandboxes with: the node's driver and limits, bound once.

Handed to handlers as ``ctx.sandboxes`` (the ``Sandboxes`` protocol of ``farm.handlers.base``),
so a handler asks for a sandbox by spec and never sees settings. Sandboxes live on this node; a
RUN or EVAL worker of the same node attaches to the one INIT made (the job's stages are routed
here for that reason).
"""

from __future__ import annotations

import hashlib
import json
import logging
import shutil
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from farm.config import Settings
from farm.errors import SandboxError
from farm.sandbox import SandboxSpec, attach_sandbox, create_sandbox, environments, sandbox_root
from farm.sandbox.environments import EnvironmentKind
from farm.sandbox.node_reaper import ensure_node_reaper
from farm.sandbox.pool import PoolKeeper, WarmPool
from farm.sandbox.prepared import Prepared, prepared
from farm.sandbox.server_sandbox import ServerSandbox

log = logging.getLogger(__name__)


class SandboxResources:
    def __init__(self, settings: Settings) -> None:
        self._settings = settings
        self.driver = settings.sandbox.driver
        # Sandboxes this process started, until their server exits: their Popen handles must
        # live on to reap the server (another worker usually closes it).
        self._started: dict[str, ServerSandbox] = {}
        self._lock = threading.Lock()
        #: the node's warm pool (``sandbox.pool_size`` > 0): ``create`` takes from it first.
        self.pool: WarmPool | None = None
        self._keeper: PoolKeeper | None = None
        if settings.sandbox.pool_size > 0:
            self.pool = WarmPool(
                root=sandbox_root(settings),
                driver=self.driver,
                settings=settings.sandbox,
                create=lambda spec: create_sandbox(settings, spec),
                attach=lambda sandbox_id: attach_sandbox(settings, sandbox_id, claim=False),  # adopt claims
            )

    def start_pool(self, demand: Callable[[], int | None] = lambda: None) -> PoolKeeper | None:
        """Keep the node's pool filled from this process (if no other process on the node does):
        ``demand`` says how many sandboxes the queue will soon ask for (None: unknown)."""
        if self.pool is None or self._keeper is not None:
            return self._keeper
        if self._settings.sandbox.node_reaper:  # warm sandboxes of a killed keeper must go too
            ensure_node_reaper(self._settings.sandbox, sandbox_root(self._settings))
        self._keeper = PoolKeeper(self.pool, demand=demand).start()
        return self._keeper

    def stop_pool(self) -> None:
        """Stop refilling and close the warm sandboxes this process started."""
        if self._keeper is not None:
            self._keeper.stop(drain=True)
            self._keeper = None

    def create(self, spec: SandboxSpec) -> ServerSandbox:
        """A sandbox owned by this process: a warm one from the pool when it has one of this
        spec's shape, else started now (blocking: call from a thread in async code).

        Raises:
            SandboxUnavailable: the runtime is missing or the sandbox did not come up.
        """
        if self.pool is not None:
            warm = self.pool.take(spec)
            if warm is not None:
                return warm
        sandbox = create_sandbox(self._settings, spec)
        with self._lock:
            for sandbox_id in [i for i, s in self._started.items() if s.started_here_and_exited()]:
                del self._started[sandbox_id]
            self._started[sandbox.id] = sandbox
        return sandbox

    def attach(self, sandbox_id: str) -> ServerSandbox:
        """The sandbox another worker of this node made; this process becomes its owner.

        Raises:
            SandboxError: no such sandbox here (it was reaped, or this is another node).
        """
        return attach_sandbox(self._settings, sandbox_id, claim=True)

    def destroy(self, sandbox_id: str) -> None:
        """Close a sandbox by id; one that is already gone is not an error."""
        with self._lock:
            started = self._started.pop(sandbox_id, None)
        try:
            sandbox = attach_sandbox(self._settings, sandbox_id, claim=True)
        except SandboxError:
            sandbox = None
        if sandbox is not None:
            sandbox.close()
        if started is not None:
            started.close()  # reaps the server process this process started

    def environment(self, kind: EnvironmentKind, packages: tuple[str, ...]) -> Path:
        """A venv or npm tree with ``packages``, built once per node (blocking: it may take minutes).

        Raises:
            SandboxUnavailable: the build failed.
        """
        return environments.build(sandbox_root(self._settings) / "envs", kind, packages)

    @contextmanager
    def prepared(self, recipe: dict[str, Any], build: Callable[[Path], dict[str, Any]]) -> Iterator[Prepared]:
        """The starting workspace ``recipe`` describes, built by ``build(dest)`` once per node and
        shared (``sandbox.share_preparation``), else built now for this caller alone.

        ``recipe`` is JSON naming everything that decides what ``build`` makes; the driver is added
        here (a setup run under one driver may not suit another).
        """
        blob = json.dumps({"recipe": recipe, "driver": self.driver}, sort_keys=True, default=str)
        key = hashlib.sha256(blob.encode()).hexdigest()[:24]
        if self._settings.sandbox.share_preparation:
            with prepared(sandbox_root(self._settings), key, build) as shared:
                yield shared
            return
        with self.scratch_dir(prefix="prepare-") as dest:
            started = time.monotonic()
            (dest / "workspace").mkdir()
            state = build(dest / "workspace")
            yield Prepared(key, dest / "workspace", state, built=True, build_s=time.monotonic() - started)

    @contextmanager
    def scratch_dir(self, prefix: str = "scratch-") -> Iterator[Path]:
        """A host directory for files a sandbox starts from (removed on exit)."""
        root = sandbox_root(self._settings) / "scratch"
        root.mkdir(parents=True, exist_ok=True)
        path = Path(tempfile.mkdtemp(prefix=prefix, dir=root))
        try:
            yield path
        finally:
            shutil.rmtree(path, ignore_errors=True)
