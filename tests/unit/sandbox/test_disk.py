from __future__ import annotations

from pathlib import Path

import pytest

from farm.config import Settings
from farm.errors import DiskQuotaUnavailable, SandboxUnavailable
from farm.sandbox import SandboxSpec, create_sandbox
from farm.sandbox import server_sandbox as sandbox_common
from farm.sandbox.base import Limits
from farm.sandbox.disk import mkfs_argv, mount_argv, release_fs


def test_mkfs_argv_makes_a_throwaway_ext4_with_no_root_reserve() -> None:
    argv = mkfs_argv(mkfs="/sbin/mkfs.ext4", image=Path("/sb/x/fs.img"))
    assert argv[0] == "/sbin/mkfs.ext4" and argv[-1] == "/sb/x/fs.img"
    assert argv[argv.index("-m") + 1] == "0"  # the sandbox may use all of it
    assert argv[argv.index("-O") + 1] == "^has_journal"


def test_mount_argv_loop_mounts_without_setuid_or_devices() -> None:
    argv = mount_argv(image=Path("/sb/x/fs.img"), target=Path("/sb/x/fs"))
    options = argv[argv.index("-o") + 1].split(",")
    assert {"loop", "nosuid", "nodev"} <= set(options)
    assert argv[-2:] == ["/sb/x/fs.img", "/sb/x/fs"]


def test_release_fs_leaves_a_plain_directory_alone(tmp_path: Path) -> None:
    (tmp_path / "fs" / "workspace").mkdir(parents=True)
    release_fs(tmp_path)
    release_fs(tmp_path / "missing")
    assert (tmp_path / "fs" / "workspace").is_dir()


def _no_loop(sandbox_dir: Path, *, size_mb: int) -> None:
    raise DiskQuotaUnavailable("loop mounts need root")


def test_required_loop_quota_that_cannot_be_made_refuses_the_sandbox(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The seam stands in for a worker that may not mount (not root, no loop devices).
    monkeypatch.setattr(sandbox_common, "make_loop_fs", _no_loop)
    settings = Settings(data_dir=tmp_path, sandbox={"root_dir": tmp_path / "sb", "disk_quota": "loop"})
    with pytest.raises(SandboxUnavailable, match="disk_quota='loop'"):
        create_sandbox(settings, SandboxSpec(limits=Limits(disk_mb=8)), driver="local")
    assert [p.name for p in (tmp_path / "sb").iterdir()] == ["registry"]
    assert list((tmp_path / "sb" / "registry").iterdir()) == []


def test_auto_quota_falls_back_to_a_per_file_limit(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(sandbox_common, "make_loop_fs", _no_loop)
    settings = Settings(data_dir=tmp_path, sandbox={"root_dir": tmp_path / "sb"})
    with create_sandbox(settings, SandboxSpec(limits=Limits(disk_mb=8)), driver="local") as sandbox:
        assert sandbox.record.disk_quota == "rlimit"
        config = sandbox._server_config(SandboxSpec(), {"cpu_time_s": None, "disk_mb": 8}, socket_path="s")
        assert config["fsize_bytes"] == 8 * 1024 * 1024
