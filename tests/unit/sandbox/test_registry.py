from __future__ import annotations

import os
import stat
import subprocess
import sys
import time
from pathlib import Path

import pytest

from farm.config import Settings
from farm.errors import ConfigError
from farm.sandbox import create_sandbox, driver_class
from farm.sandbox.base import Limits, SandboxSpec
from farm.sandbox.procs import ProcRef
from farm.sandbox.registry import Registry, SandboxRecord, remove_tree
from farm.sandbox.server_sandbox import resolved_limits


def _dead_pid() -> ProcRef:
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    ref = ProcRef.of(proc.pid)
    assert ref is not None
    proc.wait()
    return ref


def _record(tmp_path: Path, owner: ProcRef, procs: list[ProcRef], **kw) -> SandboxRecord:
    sdir = tmp_path / "sb1"
    (sdir / "workspace").mkdir(parents=True)
    return SandboxRecord(
        id="sb1", driver="local", dir=str(sdir), owner=owner, socket_path="", workdir="", procs=procs, **kw
    )


def test_proc_ref_identifies_by_pid_and_start_time() -> None:
    me = ProcRef.of(__import__("os").getpid())
    assert me is not None and me.alive()
    impostor = ProcRef(me.pid, me.start + 1)  # same pid, other start: a reused pid
    assert not impostor.alive()
    assert not impostor.kill()
    assert not _dead_pid().alive()


def test_record_round_trips_through_json(tmp_path) -> None:
    rec = _record(tmp_path, ProcRef(1, 2), [ProcRef(3, 4)], cgroups={"pids": "/x"}, deadline=5.0)
    assert SandboxRecord.from_json(rec.to_json()) == rec


def test_reaper_removes_sandbox_of_dead_owner_and_kills_its_processes(tmp_path) -> None:
    registry = Registry(root=tmp_path)
    child = subprocess.Popen(["sleep", "300"])
    ref = ProcRef.of(child.pid)
    assert ref is not None
    rec = _record(tmp_path, _dead_pid(), [ref])
    registry.save(rec)
    assert registry.reap() == ["sb1"]
    child.wait(timeout=10)
    assert child.returncode == -9
    assert not Path(rec.dir).exists()
    assert registry.load("sb1") is None


def test_reaper_leaves_sandbox_of_live_owner(tmp_path) -> None:
    registry = Registry(root=tmp_path)
    me = ProcRef.of(__import__("os").getpid())
    assert me is not None
    registry.save(_record(tmp_path, me, []))
    assert registry.reap() == []
    assert registry.load("sb1") is not None


def test_reaper_removes_sandbox_past_its_wall_time(tmp_path) -> None:
    registry = Registry(root=tmp_path)
    me = ProcRef.of(__import__("os").getpid())
    assert me is not None
    registry.save(_record(tmp_path, me, [], deadline=time.time() - 1))
    assert registry.reap() == ["sb1"]


def test_reaper_leaves_a_sandbox_that_is_being_closed(tmp_path) -> None:
    registry = Registry(root=tmp_path)
    registry.save(_record(tmp_path, _dead_pid(), []))
    with registry.locked("sb1") as got:  # close() holds the lock while it tears the sandbox down
        assert got
        assert registry.reap() == []
        assert registry.load("sb1") is not None
    assert registry.reap() == ["sb1"]


def test_remove_tree_never_chmods_a_host_file_through_a_symlink(tmp_path, monkeypatch) -> None:
    # Given a sandbox tree holding a link to a host file, whose unlink fails once (an unwritable dir),
    host = tmp_path / "host.txt"
    host.write_text("secret")
    host.chmod(0o644)
    tree = tmp_path / "sb"
    tree.mkdir()
    (tree / "link").symlink_to(host)
    real_unlink, refused = os.unlink, list[object]()

    def unlink_refusing_once(path, *args, **kwargs):
        if os.fspath(path).endswith("link") and not refused:
            refused.append(path)
            raise PermissionError(13, "Permission denied", os.fspath(path))
        return real_unlink(path, *args, **kwargs)

    monkeypatch.setattr(os, "unlink", unlink_refusing_once)
    # when the tree is removed, the retry does not make the host file the link points at 0700.
    remove_tree(tree)
    assert refused and not tree.exists()
    assert stat.S_IMODE(host.stat().st_mode) == 0o644


def test_reaper_never_signals_a_reused_pid(tmp_path) -> None:
    registry = Registry(root=tmp_path)
    bystander = subprocess.Popen(["sleep", "300"])
    try:
        ref = ProcRef.of(bystander.pid)
        assert ref is not None
        registry.save(_record(tmp_path, _dead_pid(), [ProcRef(ref.pid, ref.start - 1)]))
        assert registry.reap() == ["sb1"]
        assert bystander.poll() is None
    finally:
        bystander.kill()
        bystander.wait()


def test_limits_from_spec_override_settings_and_zero_means_unlimited() -> None:
    settings = Settings().sandbox
    limits = resolved_limits(SandboxSpec(limits=Limits(memory_mb=128, pids=0)), settings)
    assert limits["memory_mb"] == 128
    assert limits["pids"] is None
    assert limits["wall_time_s"] == settings.wall_time_s


def test_unknown_driver_is_a_config_error(tmp_path) -> None:
    with pytest.raises(ConfigError, match="bwrap"):
        driver_class("podman")
    with pytest.raises(ConfigError):
        create_sandbox(Settings(data_dir=tmp_path, sandbox={"driver": "podman"}))


def test_start_reaper_sweeps_until_stopped(tmp_path) -> None:
    import threading

    from farm.sandbox import sandbox_root, start_reaper

    settings = Settings(data_dir=tmp_path, sandbox={"reap_interval_s": 0.05, "node_reaper": False})
    registry = Registry(root=sandbox_root(settings))
    registry.save(_record(tmp_path, _dead_pid(), []))
    stop = threading.Event()
    thread = start_reaper(settings, stop=stop)
    deadline = time.monotonic() + 10
    while registry.load("sb1") is not None:
        assert time.monotonic() < deadline, "the reaper never removed the orphan"
        time.sleep(0.02)
    stop.set()
    thread.join(timeout=5)
    assert not thread.is_alive()
