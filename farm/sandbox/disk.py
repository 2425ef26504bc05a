"""The per-sandbox disk quota: everything a sandbox writes lands in one size-limited file system.

A sandbox's writable directories (workspace, /tmp, the server's socket dir) and the server's log
live under ``<sandbox dir>/fs``. With the ``loop`` quota that directory is an ext4 file system in a
sparse image file (``<sandbox dir>/fs.img``, as large as the quota, taking only what is written),
loop-mounted on the host: a process inside that writes until the disk is full gets ENOSPC, the
host's file system never holds more than the image. The host reads the workspace at its usual path
(snapshots, graders), and teardown (close or the reaper) unmounts it before the files go.

Loop mounts need root (CAP_SYS_ADMIN) and loop devices. Without them (an unprivileged worker, a
container without the capability) the ``rlimit`` fallback caps each file a sandbox process writes
(RLIMIT_FSIZE, EFBIG past it): it stops one runaway file, not many files.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import errno
import logging
import os
import shutil
import subprocess
from pathlib import Path

from farm.errors import DiskQuotaUnavailable

log = logging.getLogger(__name__)

#: the directory holding everything a sandbox writes, relative to its sandbox dir.
FS_DIR = "fs"
#: the image file behind FS_DIR when it is a loop mount.
IMAGE_FILE = "fs.img"
#: how long mkfs or mount may take.
DISK_CMD_TIMEOUT_S = 60.0
_MNT_DETACH = 2


def fs_dir(sandbox_dir: Path) -> Path:
    return sandbox_dir / FS_DIR


def mkfs_argv(*, mkfs: str, image: Path) -> list[str]:
    """mkfs.ext4 for a throwaway file system: no journal, no root reserve, lazy inode tables."""
    return [mkfs, "-q", "-F", "-m", "0", "-O", "^has_journal", "-E", "lazy_itable_init=1,nodiscard", str(image)]


def mount_argv(*, image: Path, target: Path) -> list[str]:
    # mount(8) sets up the loop device with autoclear: unmounting the file system frees the device.
    return ["mount", "-t", "ext4", "-o", "loop,nosuid,nodev,noatime", str(image), str(target)]


def make_loop_fs(sandbox_dir: Path, *, size_mb: int) -> None:
    """Create ``<sandbox_dir>/fs`` as an ext4 file system of ``size_mb`` MiB in a sparse image.

    Raises:
        DiskQuotaUnavailable: not root, mkfs or mount missing, or the mount refused.
    """
    target = fs_dir(sandbox_dir)
    target.mkdir(parents=True, exist_ok=True)
    if os.geteuid() != 0:
        raise DiskQuotaUnavailable("loop mounts need root")
    mkfs = shutil.which("mkfs.ext4") or shutil.which("mkfs.ext4", path="/usr/sbin:/sbin")
    if mkfs is None or shutil.which("mount") is None:
        raise DiskQuotaUnavailable("mkfs.ext4 or mount is not installed (apt-get install e2fsprogs mount)")
    image = sandbox_dir / IMAGE_FILE
    with open(image, "wb") as fh:
        fh.truncate(size_mb * 1024 * 1024)  # sparse: the host's disk holds only what is written
    for argv in (mkfs_argv(mkfs=mkfs, image=image), mount_argv(image=image, target=target)):
        try:
            done = subprocess.run(argv, capture_output=True, text=True, timeout=DISK_CMD_TIMEOUT_S, check=False)
        except (OSError, subprocess.SubprocessError) as exc:
            image.unlink(missing_ok=True)
            raise DiskQuotaUnavailable(f"{argv[0]} failed: {exc}") from exc
        if done.returncode != 0:
            image.unlink(missing_ok=True)
            raise DiskQuotaUnavailable(f"{' '.join(argv[:2])} failed: {(done.stderr or done.stdout).strip()}")


def _umount2(path: Path, flags: int) -> int:
    libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
    if libc.umount2(os.fsencode(path), flags) == 0:
        return 0
    return ctypes.get_errno()


def release_fs(sandbox_dir: Path) -> None:
    """Unmount ``<sandbox_dir>/fs`` if it is a mount (lazily when still busy); safe to repeat.

    The loop device goes with the last reference to the file system; the image is removed with
    the sandbox dir afterwards.
    """
    target = fs_dir(sandbox_dir)
    for _ in range(8):  # a mount stacked on the mount (there should be none) is peeled off too
        if not os.path.ismount(target):
            return
        err = _umount2(target, 0)
        if err == errno.EBUSY:
            # A process outside the sandbox's tree still has a file open there: detach now,
            # the kernel frees the file system and its loop device when that file is closed.
            log.warning("sandbox file system %s is busy: detached lazily", target)
            err = _umount2(target, _MNT_DETACH)
        if err not in (0, errno.EINVAL):
            log.warning("could not unmount %s: %s", target, os.strerror(err))
            return
