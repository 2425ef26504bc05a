"""Every sandbox on a node, tracked by id in a directory of JSON records; and the reaper.

A record names the sandbox's owner (the worker process using it), the processes that hold
its tree (each by pid *and* start time), its cgroups and its files. ``close()`` and the
reaper tear down from the record alone, so a sandbox whose worker was SIGKILLed is removed
by any other process on the node. Nothing here looks processes up by name.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import logging
import os
import shutil
import stat
import subprocess
import time
from collections.abc import Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from farm.sandbox.disk import release_fs
from farm.sandbox.procs import Cgroups, ProcRef, wait_gone

log = logging.getLogger(__name__)

#: how long teardown waits for killed processes to disappear.
KILL_WAIT_S = 5.0


@dataclass
class SandboxRecord:
    id: str
    driver: str
    dir: str
    owner: ProcRef
    socket_path: str
    workdir: str
    procs: list[ProcRef] = field(default_factory=list)
    #: process groups killed at teardown (the local driver's server session).
    pgids: list[int] = field(default_factory=list)
    cgroups: dict[str, str] = field(default_factory=dict)
    deadline: float | None = None
    created_at: float = field(default_factory=time.time)
    label: str = ""
    #: a command that stops what the driver started outside our process tree (a Singularity instance).
    stop_argv: list[str] = field(default_factory=list)
    #: how the disk quota is enforced: ``loop`` (a mounted image), ``rlimit`` (per file) or ``""`` (none).
    disk_quota: str = ""
    #: the unpacked image the sandbox runs over (its key in the image cache), or ``""``.
    image: str = ""
    #: how a command inside runs the host's Python, and the environment it needs (image sandboxes).
    python: list[str] = field(default_factory=list)
    python_env: dict[str, str] = field(default_factory=dict)

    def to_json(self) -> str:
        return json.dumps(asdict(self), indent=1)

    @classmethod
    def from_json(cls, text: str) -> SandboxRecord:
        data: dict[str, Any] = json.loads(text)
        data["owner"] = ProcRef(**data["owner"])
        data["procs"] = [ProcRef(**p) for p in data["procs"]]
        return cls(**data)


class Registry:
    """The records directory of one node (``<sandbox root>/registry``)."""

    def __init__(self, *, root: Path) -> None:
        self.dir = root / "registry"
        self.dir.mkdir(parents=True, exist_ok=True)

    def _path(self, sandbox_id: str) -> Path:
        return self.dir / f"{sandbox_id}.json"

    def save(self, record: SandboxRecord) -> None:
        tmp = self._path(record.id).with_suffix(".tmp")
        tmp.write_text(record.to_json())
        tmp.replace(self._path(record.id))  # atomic: a reaper never reads half a record

    def load(self, sandbox_id: str) -> SandboxRecord | None:
        try:
            return SandboxRecord.from_json(self._path(sandbox_id).read_text())
        except FileNotFoundError:
            return None

    def records(self) -> list[SandboxRecord]:
        out = []
        for path in sorted(self.dir.glob("*.json")):
            with contextlib.suppress(FileNotFoundError, ValueError, KeyError, TypeError):
                out.append(SandboxRecord.from_json(path.read_text()))
        return out

    @contextlib.contextmanager
    def locked(self, sandbox_id: str, *, wait: bool = True) -> Iterator[bool]:
        """Serialises teardown of one sandbox between close() and reapers; yields False if busy."""
        with open(self.dir / f"{sandbox_id}.lock", "a") as fh:
            try:
                fcntl.flock(fh, fcntl.LOCK_EX | (0 if wait else fcntl.LOCK_NB))
            except BlockingIOError:
                yield False
                return
            yield True

    def destroy(self, record: SandboxRecord) -> None:
        """Kill everything the record names and remove its files; safe to repeat."""
        cgroups = Cgroups({k: Path(v) for k, v in record.cgroups.items()})
        # Members seen before the kill: they leave the cgroup early in their exit, so wait for them.
        members = [ref for ref in map(ProcRef.of, cgroups.pids()) if ref is not None]
        for proc in record.procs:
            proc.kill()
        for pgid in record.pgids:
            with contextlib.suppress(OSError):
                os.killpg(pgid, 9)
        if record.stop_argv:
            with contextlib.suppress(OSError, subprocess.SubprocessError):
                subprocess.run(record.stop_argv, capture_output=True, timeout=60, check=False)
        wait_gone(record.procs + members, timeout_s=KILL_WAIT_S)
        cgroups.destroy(timeout_s=KILL_WAIT_S)
        release_fs(Path(record.dir))  # else the image's loop mount would outlive its deleted file
        remove_tree(Path(record.dir))
        self._path(record.id).unlink(missing_ok=True)
        (self.dir / f"{record.id}.lock").unlink(missing_ok=True)

    def reap(self, *, now: float | None = None) -> list[str]:
        """Remove sandboxes whose owner process is gone or whose wall time ran out; their ids."""
        now = time.time() if now is None else now
        reaped = []
        for record in self.records():
            expired = record.deadline is not None and now > record.deadline
            if record.owner.alive() and not expired:
                continue
            with self.locked(record.id, wait=False) as got:
                if not got or self.load(record.id) is None:
                    continue  # being closed right now, or already gone
                log.warning(
                    "reaping sandbox %s (%s)", record.id, "wall time exceeded" if expired else "owner process died"
                )
                self.destroy(record)
                reaped.append(record.id)
        return reaped


def remove_tree(path: Path) -> None:
    """rm -rf that also gets through directories the sandbox made unwritable."""

    def fix(func: Any, p: str, _exc: Any) -> None:
        # Never chmod through a symlink: the sandbox may point one at a host file.
        with contextlib.suppress(OSError):
            for target in (os.path.dirname(p), p):
                if not os.path.islink(target):
                    os.chmod(target, stat.S_IRWXU)
        with contextlib.suppress(OSError):
            func(p)

    if path.exists():
        shutil.rmtree(path, onerror=fix)
