"""The warm pool with real bwrap sandboxes: hand-out, shapes, one claim per sandbox, a dead keeper."""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from farm.config import Settings
from farm.sandbox import SandboxSpec, attach_sandbox, sandbox_root
from farm.sandbox.base import Limits
from farm.sandbox.node_reaper import ensure_node_reaper, running
from farm.sandbox.pool import PoolKeeper, pool_key
from farm.sandbox.registry import Registry
from farm.worker.sandboxes import SandboxResources

pytestmark = pytest.mark.usefixtures("need_bwrap")


@pytest.fixture
def pooled(sandbox_settings: Settings) -> Settings:
    update = {"pool_size": 2, "pool_min": 2, "node_reaper": False}
    return sandbox_settings.model_copy(update={"sandbox": sandbox_settings.sandbox.model_copy(update=update)})


@pytest.fixture
def resources(pooled: Settings) -> Iterator[SandboxResources]:
    made = SandboxResources(pooled)
    yield made
    if made._keeper is not None:
        made._keeper.stop(drain=False)
    Registry(root=sandbox_root(pooled)).reap(now=float("inf"))  # whatever a failed test left
    made.stop_pool()


def _warm(resources: SandboxResources, spec: SandboxSpec) -> PoolKeeper:
    keeper = resources.start_pool()
    assert keeper is not None
    resources.create(spec).close()  # the first ask is cold, and makes the shape wanted
    assert keeper.wait_full(timeout_s=60)
    return keeper


def test_pool_hands_out_a_warm_sandbox_adopted_for_the_spec(resources: SandboxResources, tmp_path: Path) -> None:
    _warm(resources, SandboxSpec(limits=Limits(wall_time_s=600)))
    assert resources.pool is not None
    warm_ids = {e.name.partition("-")[2] for k in resources.pool._shapes() for e in resources.pool._entries(k)}
    seed = tmp_path / "seed"
    seed.mkdir()
    (seed / "task.txt").write_text("the task\n")
    # When INIT asks for the same shape with its own workspace and label
    before = time.time()
    sandbox = resources.create(SandboxSpec(workspace=seed, label="job 7", limits=Limits(wall_time_s=600)))
    # Then it gets a warm one, owned by this process, with the workspace copied in and writable
    assert sandbox.id in warm_ids
    assert sandbox.run("cat task.txt && echo more >> task.txt && echo ok").output == "the task\nok\n"
    record = Registry(root=Path(sandbox.record.dir).parent).load(sandbox.id)
    assert record is not None and record.owner.pid == os.getpid() and record.label == "job 7"
    # and its hard lifetime counts from the hand-out, not from when it was started for the pool
    assert record.deadline is not None and before + 600 <= record.deadline <= time.time() + 600
    sandbox.close()


def test_pool_keeps_shapes_apart(resources: SandboxResources, tmp_path: Path) -> None:
    _warm(resources, SandboxSpec())
    assert pool_key(SandboxSpec(workspace=tmp_path, label="x"), "bwrap") == pool_key(SandboxSpec(), "bwrap")
    assert resources.pool is not None
    # A spec of another shape (its own env) finds no warm sandbox: it is started cold
    assert resources.pool.take(SandboxSpec(env={"A": "1"})) is None
    sandbox = resources.create(SandboxSpec(env={"A": "1"}))
    assert sandbox.run("echo $A").output == "1\n"
    sandbox.close()


def test_pool_gives_each_warm_sandbox_to_one_caller(resources: SandboxResources) -> None:
    keeper = _warm(resources, SandboxSpec())
    keeper.stop(drain=False)  # no refill: two warm sandboxes for eight callers
    assert resources.pool is not None
    got: list[str | None] = []
    lock = threading.Lock()

    def take() -> None:
        sandbox = resources.pool.take(SandboxSpec()) if resources.pool else None
        with lock:
            got.append(sandbox.id if sandbox else None)

    threads = [threading.Thread(target=take) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    handed = [i for i in got if i is not None]
    assert len(handed) == 2 and len(set(handed)) == 2
    for sandbox_id in handed:
        attach_sandbox(resources._settings, sandbox_id).close()


def test_pool_drops_entries_of_sandboxes_reaped_meanwhile(resources: SandboxResources) -> None:
    keeper = _warm(resources, SandboxSpec())
    assert resources.pool is not None
    kdir = resources.pool._shapes()[0]
    first = resources.pool._entries(kdir)[0]
    # Given a warm sandbox removed behind the pool's back (its keeper died and the reaper ran)
    attach_sandbox(resources._settings, first.name.partition("-")[2], claim=False).close()
    # Then the next refill forgets it and starts another
    resources.pool.taken.set()
    assert keeper.wait_full(timeout_s=60)
    entries = resources.pool._entries(kdir)
    assert first not in entries and len(entries) == 2


def test_node_reaper_runs_once_per_root_and_leaves_when_idle(sandbox_settings: Settings) -> None:
    settings = sandbox_settings.sandbox.model_copy(update={"node_reaper_interval_s": 0.1, "node_reaper_idle_s": 0.5})
    root = sandbox_root(sandbox_settings)
    assert ensure_node_reaper(settings, root)
    assert running(root)
    assert not ensure_node_reaper(settings, root)  # one per root
    deadline = time.monotonic() + 10
    while running(root) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not running(root)
