from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

from farm.config import Settings
from farm.errors import DiskQuotaUnavailable, SandboxUnavailable
from farm.sandbox import SandboxSpec, create_sandbox, disk
from farm.sandbox import server_sandbox as sandbox_common
from farm.sandbox.base import Limits
from farm.sandbox.disk import mkfs_argv, mount_argv, release_fs

IN_CI = bool(os.environ.get("CI"))


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


MIB = 1024 * 1024


def _ext4_size(image: Path) -> int:
    """The size of the ext4 file system in ``image``, from its superblock (at byte 1024)."""
    with open(image, "rb") as fh:
        fh.seek(1024)
        block = fh.read(1024)
    assert int.from_bytes(block[0x38:0x3A], "little") == 0xEF53, "no ext4 superblock"
    blocks = int.from_bytes(block[0x04:0x08], "little")
    return blocks * (1024 << int.from_bytes(block[0x18:0x1C], "little"))


def test_loop_quota_makes_a_file_system_as_large_as_the_quota_in_a_sparse_image(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The real mkfs, a stand-in for the mount (which alone needs root): the quota is the size of
    # the file system made, whoever runs this.
    if shutil.which("mkfs.ext4", path="/usr/sbin:/sbin:/usr/bin:/bin") is None:
        if IN_CI:
            pytest.fail("mkfs.ext4 is not installed (apt-get install e2fsprogs)")
        pytest.skip("mkfs.ext4 is not installed (apt-get install e2fsprogs)")
    monkeypatch.setattr(os, "geteuid", lambda: 0)
    monkeypatch.setattr(disk, "mount_argv", lambda *, image, target: ["true"])
    disk.make_loop_fs(tmp_path, size_mb=16)
    image = tmp_path / disk.IMAGE_FILE
    assert image.stat().st_size == 16 * MIB
    assert _ext4_size(image) == 16 * MIB
    assert image.stat().st_blocks * 512 < 4 * MIB  # sparse: the host holds only what mkfs wrote
    assert (tmp_path / disk.FS_DIR).is_dir()


def test_loop_quota_mounts_the_image_it_made_on_the_sandboxs_file_system_dir(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    ran: list[tuple[list[str], int]] = []

    def run(argv: list[str], **kwargs: object) -> subprocess.CompletedProcess[str]:
        ran.append((argv, (tmp_path / disk.IMAGE_FILE).stat().st_size))
        return subprocess.CompletedProcess(argv, 0, "", "")

    monkeypatch.setattr(os, "geteuid", lambda: 0)
    monkeypatch.setattr(shutil, "which", lambda name, path=None: f"/sbin/{name}")
    monkeypatch.setattr(subprocess, "run", run)
    disk.make_loop_fs(tmp_path, size_mb=8)
    image = tmp_path / disk.IMAGE_FILE
    assert ran == [
        (mkfs_argv(mkfs="/sbin/mkfs.ext4", image=image), 8 * MIB),
        (mount_argv(image=image, target=tmp_path / disk.FS_DIR), 8 * MIB),
    ]


def test_loop_quota_that_cannot_be_mounted_leaves_no_image(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    def run(argv: list[str], **kwargs: object) -> subprocess.CompletedProcess[str]:
        return subprocess.CompletedProcess(argv, 0 if "mkfs" in argv[0] else 32, "", "mount: permission denied")

    monkeypatch.setattr(os, "geteuid", lambda: 0)
    monkeypatch.setattr(shutil, "which", lambda name, path=None: f"/sbin/{name}")
    monkeypatch.setattr(subprocess, "run", run)
    with pytest.raises(DiskQuotaUnavailable, match="permission denied"):
        disk.make_loop_fs(tmp_path, size_mb=8)
    assert not (tmp_path / disk.IMAGE_FILE).exists()


def test_rlimit_quota_caps_each_file_a_sandbox_process_writes(tmp_path: Path) -> None:
    # The execution server sets the per-file limit for everything it starts (farm.tools.server).
    settings = Settings(data_dir=tmp_path, sandbox={"root_dir": tmp_path / "sb", "disk_quota": "rlimit"})
    with create_sandbox(settings, SandboxSpec(limits=Limits(disk_mb=1)), driver="local") as sandbox:
        assert sandbox.record.disk_quota == "rlimit"
        tools = sandbox.tools()
        written = tools.bash("head -c 3000000 /dev/zero > big.bin; wc -c < big.bin")
        assert written.output.splitlines()[-1] == str(MIB)
        assert "File too large" in written.output
        ran = sandbox.run(["python3", "-c", "open('other.bin', 'wb').write(bytes(2 * 1024 * 1024))"])
        assert ran.exit_code != 0 and "File too large" in ran.output
        assert (Path(sandbox.workdir) / "other.bin").stat().st_size == MIB
