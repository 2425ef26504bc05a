"""Sandboxes: pick a driver by name from settings, create, attach from another worker, reap.

::

    sandbox = create_sandbox(settings, SandboxSpec(workspace=task_dir))
    tools = sandbox.tools()
    tools.bash("pytest -x")              # ToolResult(output, exit_code, timed_out, error, ...)
    snap = sandbox.snapshot()
    sandbox.close()

A RUN worker that did not create the sandbox uses ``attach_sandbox(settings, sandbox_id)``;
every worker process calls ``reap_sandboxes(settings)`` now and then.
"""

from __future__ import annotations

import importlib
import logging
import threading
from pathlib import Path

from farm.config import Settings
from farm.errors import ConfigError
from farm.sandbox.base import Bind, ExecResult, Limits, Sandbox, SandboxSpec, Snapshot
from farm.sandbox.node_reaper import ensure_node_reaper
from farm.sandbox.prepared import reap_prepared
from farm.sandbox.ratelimit import CreateRateLimit
from farm.sandbox.registry import Registry
from farm.sandbox.server_sandbox import ServerSandbox

#: driver name -> class, imported on use.
DRIVERS: dict[str, str] = {
    "bwrap": "farm.sandbox.bwrap:BwrapSandbox",
    "docker": "farm.sandbox.docker:DockerSandbox",
    "local": "farm.sandbox.local:LocalSandbox",
    "singularity": "farm.sandbox.singularity:SingularitySandbox",
}

__all__ = [
    "DRIVERS",
    "Bind",
    "ExecResult",
    "Limits",
    "Sandbox",
    "SandboxSpec",
    "Snapshot",
    "attach_sandbox",
    "create_sandbox",
    "driver_class",
    "reap_sandboxes",
    "start_reaper",
    "sandbox_root",
]


def sandbox_root(settings: Settings) -> Path:
    return settings.sandbox.root_dir or settings.data_dir / "sandboxes"


def driver_class(name: str) -> type[ServerSandbox]:
    """Raises:
    ConfigError: unknown driver name.
    """
    try:
        module, _, attr = DRIVERS[name].partition(":")
    except KeyError:
        raise ConfigError(f"unknown sandbox driver {name!r}; known: {', '.join(sorted(DRIVERS))}") from None
    cls: type[ServerSandbox] = getattr(importlib.import_module(module), attr)
    return cls


def create_sandbox(settings: Settings, spec: SandboxSpec | None = None, *, driver: str | None = None) -> ServerSandbox:
    """Create and start a sandbox with ``driver`` (default: ``settings.sandbox.driver``).

    Raises:
        ConfigError: unknown driver.
        SandboxUnavailable: the runtime is missing or refused to start.
    """
    cls = driver_class(driver or settings.sandbox.driver)
    root = sandbox_root(settings)
    CreateRateLimit(root, rate=settings.sandbox.max_creates_per_s, burst=settings.sandbox.create_burst).acquire()
    return cls.create(spec=spec or SandboxSpec(), settings=settings.sandbox, root=sandbox_root(settings))


def attach_sandbox(settings: Settings, sandbox_id: str, *, claim: bool = True) -> ServerSandbox:
    """Use a sandbox created by another process on this node; ``claim`` makes this process its owner.

    Raises:
        SandboxError: no such sandbox on this node.
    """
    registry = Registry(root=sandbox_root(settings))
    record = registry.load(sandbox_id)
    # The driver's own class: what it does on the host side (the uid files are chowned to) applies.
    cls = driver_class(record.driver) if record is not None and record.driver in DRIVERS else ServerSandbox
    return cls.attach(registry=registry, settings=settings.sandbox, sandbox_id=sandbox_id, claim=claim)


def reap_sandboxes(settings: Settings) -> list[str]:
    """Remove sandboxes whose owner process died or whose wall time ran out; returns their ids.

    Prepared workspaces unused for ``sandbox.prepared_ttl_s`` go too (not counted: they are a cache).
    """
    root = sandbox_root(settings)
    reaped = Registry(root=root).reap()
    reap_prepared(root, ttl_s=settings.sandbox.prepared_ttl_s)
    return reaped


def start_reaper(settings: Settings, *, stop: threading.Event) -> threading.Thread:
    """Reap every ``settings.sandbox.reap_interval_s`` in a daemon thread until ``stop`` is set.

    Any process on the node may run it (a worker at start-up, say): records name their owners.
    With ``sandbox.node_reaper`` it also makes sure the node's own reaper process runs
    (``farm.sandbox.node_reaper``), which goes on reaping when every worker is gone.
    """
    if settings.sandbox.node_reaper:
        ensure_node_reaper(settings.sandbox, sandbox_root(settings))

    def loop() -> None:
        while not stop.wait(settings.sandbox.reap_interval_s):
            try:
                reap_sandboxes(settings)
            except Exception:  # noqa: BLE001 - a failed sweep is retried at the next tick
                logging.getLogger(__name__).exception("sandbox reaper sweep failed")

    thread = threading.Thread(target=loop, name="farm-sandbox-reaper", daemon=True)
    thread.start()
    return thread
