"""A worker holding sandboxes is SIGKILLed: the node's own reaper leaves nothing behind.

No test code reaps: the node reaper the worker started (``farm.sandbox.node_reaper``) must find
the dead owner by itself, and ``find_leftovers`` counts from the kernel's tables (mounts, loop
devices, cgroups, processes) as well as the sandbox directories.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from farm.config import Settings
from farm.sandbox.leftovers import Leftovers, find_leftovers
from farm.sandbox.node_reaper import running
from tests.integration.sandbox.conftest import REPO, require_bwrap

pytestmark = pytest.mark.crash

#: a stand-in for an INIT worker: a warm pool, sandboxes handed out from it and one started cold,
#: each with a process of its own running, a loop-mounted disk quota and cgroups.
_WORKER = """
import json, sys
from pathlib import Path
from farm.config import Settings
from farm.sandbox import SandboxSpec, start_reaper
from farm.worker.sandboxes import SandboxResources
import threading
settings = Settings.model_validate_json(sys.argv[1])
resources = SandboxResources(settings)
start_reaper(settings, stop=threading.Event())
keeper = resources.start_pool()
resources.create(SandboxSpec(label="first ask")).close()
assert keeper.wait_full(timeout_s=60)
held = [resources.create(SandboxSpec(label=f"job {i}")) for i in range(3)]
held.append(resources.create(SandboxSpec(label="cold", env={"COLD": "1"})))
for sandbox in held:
    sandbox.tools().bash("sleep 1000 &")
assert keeper.wait_full(timeout_s=60)
print(json.dumps([s.id for s in held]), flush=True)
sys.stdin.read()
"""

#: an owner that stays alive but never closes its sandbox: its hard lifetime must still end it.
_HUNG = """
import json, sys, threading
from farm.config import Settings
from farm.sandbox import SandboxSpec, Limits, create_sandbox, start_reaper
settings = Settings.model_validate_json(sys.argv[1])
start_reaper(settings, stop=threading.Event())
sandbox = create_sandbox(settings, SandboxSpec(limits=Limits(wall_time_s=2)))
sandbox.tools().bash("sleep 1000 &")
print(json.dumps([sandbox.id]), flush=True)
sys.stdin.read()
"""


def _settings(tmp_path: Path) -> Settings:
    return Settings(
        data_dir=tmp_path / "data",
        sandbox={
            "root_dir": tmp_path / "sb",
            "pool_size": 3,
            "pool_min": 3,
            "disk_mb": 64,
            "memory_mb": 512,
            "pids": 64,
            "node_reaper_interval_s": 0.2,
            "node_reaper_idle_s": 1.0,
            # the workers' own reaper threads stay out of it: the node reaper alone must do it
            "reap_interval_s": 3600,
        },
    )


def _start(script: str, settings: Settings) -> tuple[subprocess.Popen[str], list[str]]:
    proc = subprocess.Popen(
        [sys.executable, "-c", script, settings.model_dump_json()],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        env={**os.environ, "PYTHONPATH": str(REPO)},
        text=True,
    )
    assert proc.stdout is not None
    line = proc.stdout.readline()
    assert line, "the worker died before it held its sandboxes"
    return proc, json.loads(line)


def _wait_clean(root: Path, ids: set[str], *, timeout_s: float) -> Leftovers:
    deadline = time.monotonic() + timeout_s
    while True:
        left = find_leftovers(root, ids=ids)
        if left.total() == 0 or time.monotonic() > deadline:
            return left
        time.sleep(0.2)


def _stop(proc: subprocess.Popen[str]) -> None:
    if proc.poll() is None:
        proc.kill()
    proc.wait(timeout=10)
    for pipe in (proc.stdin, proc.stdout):
        if pipe is not None:
            pipe.close()


@pytest.fixture
def fleet(tmp_path: Path) -> tuple[Settings, Path]:
    """Settings of a node with a pool of 3 per shape, and its sandbox root."""
    require_bwrap()
    settings = _settings(tmp_path)
    assert settings.sandbox.root_dir is not None
    return settings, settings.sandbox.root_dir


def test_sigkilled_worker_leaves_no_sandbox_mount_loop_cgroup_or_process(fleet: tuple[Settings, Path]) -> None:
    settings, root = fleet
    # Given a worker holding 4 sandboxes (3 from the warm pool, 1 cold of another shape) and the
    # pool refilled: 3 warm of each shape
    worker, held = _start(_WORKER, settings)
    try:
        before = find_leftovers(root, ids=set(held))
        assert len(before.sandboxes) == 10, before
        assert len(before.mounts) >= 10 and len(before.loop_devices) >= 10, before
        assert before.cgroups and before.processes, before
        # When it is SIGKILLed, and nobody else on the node reaps
        worker.send_signal(signal.SIGKILL)
        worker.wait(timeout=10)
    finally:
        _stop(worker)
    # Then the node's reaper removes everything, and exits once there is nothing left
    left = _wait_clean(root, set(held) | set(before.sandboxes), timeout_s=60)
    assert left.total() == 0, left.describe()
    deadline = time.monotonic() + 10
    while running(root) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not running(root)


def test_hard_lifetime_ends_a_sandbox_whose_owner_lives_on(fleet: tuple[Settings, Path]) -> None:
    settings, root = fleet
    # Given an owner that keeps running but never closes its 2-second sandbox
    owner, held = _start(_HUNG, settings)
    try:
        assert find_leftovers(root, ids=set(held)).sandboxes == held
        # Then, once its lifetime is over, the node's reaper has removed all of it while the owner lives
        left = _wait_clean(root, set(held), timeout_s=30)
        assert owner.poll() is None
        assert left.total() == 0, left.describe()
    finally:
        _stop(owner)
