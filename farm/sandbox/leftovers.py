"""What sandboxes left on a node: the proof that teardown and the reaper removed everything.

Counted from the kernel's own tables, not from the registry (which is what a bug would leave
behind unnoticed): mounts under the sandbox root (``/proc/self/mountinfo``), loop devices whose
backing file is under it (``/sys/block/loop*/loop/backing_file``), cgroups named after a sandbox
(``farm-<id>``), processes in such a cgroup or whose command line names the root, and the
sandbox directories and records themselves. ``farm reap`` prints it; the crash test asserts it
is empty after a worker holding sandboxes is SIGKILLed.
"""

from __future__ import annotations

import contextlib
import os
import re
from dataclasses import dataclass, field
from pathlib import Path

from farm.sandbox.procs import DEFAULT_CGROUP_ROOT

_SANDBOX_ID = re.compile(r"^[0-9a-f]{12}$")
_CGROUP_NAME = re.compile(r"farm-([0-9a-f]{12})")


@dataclass
class Leftovers:
    """Everything still on the node for the sandboxes of one root."""

    sandboxes: list[str] = field(default_factory=list)
    mounts: list[str] = field(default_factory=list)
    loop_devices: list[str] = field(default_factory=list)
    cgroups: list[str] = field(default_factory=list)
    processes: list[int] = field(default_factory=list)

    def total(self) -> int:
        return sum(len(v) for v in vars(self).values())

    def describe(self) -> str:
        return ", ".join(f"{len(v)} {k.replace('_', ' ')}" for k, v in vars(self).items())


def _under(path: str, root: str) -> bool:
    return path == root or path.startswith(root.rstrip("/") + "/")


def _unescape(path: str) -> str:
    # mountinfo escapes spaces and the like as octal (\040).
    return re.sub(r"\\([0-7]{3})", lambda m: chr(int(m.group(1), 8)), path)


def find_leftovers(root: Path, *, ids: set[str] | None = None, cgroup_root: Path = DEFAULT_CGROUP_ROOT) -> Leftovers:
    """What remains of the sandboxes under ``root``. Cgroups and processes are matched by the
    sandbox ids found under ``root`` plus ``ids`` (those a caller saw created: their records may
    be gone while their cgroups are not)."""
    root_s = os.path.realpath(root)
    out = Leftovers()
    registry = root / "registry"
    seen = set(ids or ())
    if registry.is_dir():
        seen |= {p.stem for p in registry.glob("*.json")}
    if root.is_dir():
        seen |= {p.name for p in root.iterdir() if p.is_dir() and _SANDBOX_ID.match(p.name)}
    out.sandboxes = sorted(i for i in seen if (root / i).exists() or (registry / f"{i}.json").exists())
    with contextlib.suppress(OSError):
        for line in Path("/proc/self/mountinfo").read_text().splitlines():
            point = _unescape(line.split()[4])
            if _under(point, root_s):
                out.mounts.append(point)
    for backing in Path("/sys/block").glob("loop*/loop/backing_file"):
        with contextlib.suppress(OSError):
            if _under(backing.read_text().strip().removesuffix(" (deleted)"), root_s):
                out.loop_devices.append(backing.parts[3])
    names = {f"farm-{i}" for i in seen}
    if names and cgroup_root.is_dir():
        for dirpath, dirnames, _ in os.walk(cgroup_root):
            for d in dirnames:
                if d in names:
                    out.cgroups.append(os.path.join(dirpath, d))
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit() or int(proc.name) == os.getpid():
            continue
        with contextlib.suppress(OSError):
            groups = set(_CGROUP_NAME.findall((proc / "cgroup").read_text()))
            cmdline = (proc / "cmdline").read_bytes().decode(errors="replace")
            if "farm.sandbox.node_reaper" in cmdline:
                continue  # the reaper names the root, and leaves by itself once nothing is left
            if groups & seen or root_s + "/" in cmdline.replace("\0", " "):
                out.processes.append(int(proc.name))
    return out
