"""The node's own reaper: one process per sandbox root that outlives every worker.

The workers' reaper threads remove the sandboxes of a worker that died, but only while some
worker is alive on the node; a node whose workers were all SIGKILLed (an OOM kill of the
container, a Slurm job's end) would keep its sandboxes, their mounts, loop devices and cgroups,
and a sandbox whose owner hangs would outlive its hard lifetime. So the first worker (or pool
keeper) starts this process, detached in a session of its own; it holds ``<root>/reaper.lock``
(a second one exits at once), sweeps the registry every ``node_reaper_interval_s`` (dead owners,
deadlines passed: ``Registry.reap``) and exits once the node has had no sandbox for
``node_reaper_idle_s``, or its root is gone.

Run as ``python -m farm.sandbox.node_reaper SETTINGS_JSON ROOT`` (what ``ensure_node_reaper``
does); the settings come in as an argument, so nothing here reads the environment.
"""

from __future__ import annotations

import fcntl
import logging
import os
import subprocess
import sys
import time
from pathlib import Path

from farm.config import SandboxSettings
from farm.sandbox.prepared import reap_prepared
from farm.sandbox.registry import Registry

log = logging.getLogger(__name__)

LOCK_FILE = "reaper.lock"
#: how long ``ensure_node_reaper`` waits for the reaper to hold its lock.
START_WAIT_S = 5.0


def _lock(root: Path) -> int | None:
    """The reaper's lock, held; None when another process holds it."""
    root.mkdir(parents=True, exist_ok=True)
    fd = os.open(root / LOCK_FILE, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(fd)
        return None
    return fd


def running(root: Path) -> bool:
    """Is a node reaper holding ``root``'s lock?"""
    fd = _lock(root)
    if fd is None:
        return True
    os.close(fd)
    return False


def ensure_node_reaper(settings: SandboxSettings, root: Path) -> bool:
    """Start the node's reaper for ``root`` unless one runs; True when this call started one."""
    if running(root):
        return False
    argv = [sys.executable, "-m", "farm.sandbox.node_reaper", settings.model_dump_json(), str(root)]
    # The child forks the reaper and exits: the reaper is nobody's child here, so it never
    # lingers as a zombie of a worker, and a worker's process-group kill does not reach it.
    subprocess.run(
        argv,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
        check=False,
        timeout=30,
    )
    deadline = time.monotonic() + START_WAIT_S
    while not running(root) and time.monotonic() < deadline:
        time.sleep(0.01)  # the reaper takes its lock just after the fork
    return True


def watch(settings: SandboxSettings, root: Path, lock_fd: int) -> None:
    """Sweep until the node has been idle for ``node_reaper_idle_s`` or ``root`` is gone."""
    idle_since = time.monotonic()
    registry = Registry(root=root)
    while (root / LOCK_FILE).exists():
        try:
            reaped = registry.reap()
            if reaped:
                log.warning("node reaper removed %d sandbox(es): %s", len(reaped), ", ".join(reaped))
            reap_prepared(root, ttl_s=settings.prepared_ttl_s)
        except Exception:  # noqa: BLE001 - a failed sweep is retried at the next tick
            log.exception("node reaper sweep failed")
        if any(registry.dir.glob("*.json")):
            idle_since = time.monotonic()
        elif time.monotonic() - idle_since > settings.node_reaper_idle_s:
            break
        time.sleep(settings.node_reaper_interval_s)
    os.close(lock_fd)


def main(argv: list[str]) -> None:
    settings = SandboxSettings.model_validate_json(argv[0])
    root = Path(argv[1])
    if os.fork() != 0:
        os._exit(0)  # the parent returns to ensure_node_reaper at once
    lock_fd = _lock(root)
    if lock_fd is None:
        os._exit(0)  # another reaper won the race
    devnull = os.open(os.devnull, os.O_RDWR)
    for fd in (0, 1):
        os.dup2(devnull, fd)
    log_fd = os.open(root / "reaper.log", os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
    os.dup2(log_fd, 2)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(message)s")
    watch(settings, root, lock_fd)


if __name__ == "__main__":
    main(sys.argv[1:])
