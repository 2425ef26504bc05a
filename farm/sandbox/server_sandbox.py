"""What every driver shares: directories, the registry record, the server's start, snapshots, close.

A driver only says how to launch the execution server (``_launch``) and where the workspace
appears inside. Everything after that goes through the server's socket or the record, so a
sandbox created by an INIT worker is used by a RUN worker through :meth:`ServerSandbox.attach`.
"""

from __future__ import annotations

import errno
import json
import logging
import os
import shutil
import subprocess
import sys
import tarfile
import time
import uuid
from pathlib import Path
from typing import Any

from farm.config import SandboxSettings
from farm.errors import DiskQuotaUnavailable, SandboxError, SandboxUnavailable
from farm.sandbox.base import Bind, ExecResult, SandboxSpec, Snapshot
from farm.sandbox.disk import fs_dir, make_loop_fs
from farm.sandbox.procs import CgroupEvents, Cgroups, ProcRef
from farm.sandbox.registry import Registry, SandboxRecord
from farm.tools.base import ToolResult
from farm.tools.client import ToolClient

log = logging.getLogger(__name__)

#: the directory holding the ``farm`` package this process runs: bound into sandboxes.
FARM_SOURCE_DIR = Path(__file__).resolve().parents[2]
#: the server's socket directory inside isolated sandboxes (bound from ``<sandbox dir>/run``).
RUN_DIR_INSIDE = "/run/farm"
_READY_POLL_S = 0.005


#: where a forwarded host socket appears inside isolated sandboxes.
FORWARD_DIR_INSIDE = "/run/farm-forward"


def forward_target(port: int) -> str:
    return f"{FORWARD_DIR_INSIDE}/{port}.sock"


def server_pythonpath(farm_lib: str) -> str:
    """PYTHONPATH for the server started with ``-S``: farm first, then this interpreter's site-packages."""
    site_dirs = [p for p in sys.path if p.endswith(("site-packages", "dist-packages"))]
    return os.pathsep.join([farm_lib, *dict.fromkeys(site_dirs)])


def resolved_limits(spec: SandboxSpec, settings: SandboxSettings) -> dict[str, Any]:
    """Spec limits over settings defaults; 0 means unlimited (None)."""
    out: dict[str, Any] = {}
    for name in ("memory_mb", "pids", "cpu_time_s", "wall_time_s", "cpus", "disk_mb"):
        value = getattr(spec.limits, name)
        value = getattr(settings, name) if value is None else value
        out[name] = value or None
    return out


class ServerSandbox:
    """A sandbox whose commands go through the execution server. See :class:`farm.sandbox.base.Sandbox`."""

    driver = "server"
    isolated = True
    #: whether ``SandboxSpec.image`` is honoured (bwrap: an image file on the node; docker: an image the
    #: engine has).
    supports_images = False
    #: limits through cgroups this class makes (False: the runtime makes its own, as Docker does).
    own_cgroups = True

    def __init__(self, *, record: SandboxRecord, registry: Registry, settings: SandboxSettings) -> None:
        self.record = record
        self.registry = registry
        self.settings = settings
        self.id = record.id
        self.workdir = record.workdir
        #: everything the sandbox writes: workspace, tmp, run (socket dir), server.log; the quota's file system.
        self.fs = fs_dir(Path(record.dir))
        self.host_workspace = self.fs / "workspace"
        self._popen: subprocess.Popen[bytes] | None = None
        self._client: ToolClient | None = None
        self._cgroups = Cgroups({k: Path(v) for k, v in record.cgroups.items()})
        self._events = self._cgroups.events()
        self._closed = False

    # ---- creation -------------------------------------------------------------------------
    @classmethod
    def create(cls, *, spec: SandboxSpec, settings: SandboxSettings, root: Path) -> ServerSandbox:
        """Build and start a sandbox.

        Raises:
            SandboxUnavailable: the runtime is missing or the server did not come up.
        """
        sandbox_id = uuid.uuid4().hex[:12]
        if cls.isolated and spec.forwards:
            # Each forwarded socket is bound in at a fixed place; the server relays to it there.
            binds = [Bind(source=f.socket, target=forward_target(f.port)) for f in spec.forwards]
            spec = spec.model_copy(update={"binds": [*spec.binds, *binds]})
        registry = Registry(root=root)
        sdir = root / sandbox_id
        limits = resolved_limits(spec, settings)
        owner = ProcRef.of(os.getpid())
        assert owner is not None
        record = SandboxRecord(
            id=sandbox_id,
            driver=cls.driver,
            dir=str(sdir),
            owner=owner,
            socket_path=str(fs_dir(sdir) / "run" / "server.sock"),
            workdir=cls._workdir(spec, sdir),
            deadline=time.time() + limits["wall_time_s"] if limits["wall_time_s"] else None,
            label=spec.label,
        )
        # Recorded before anything starts: from here on a crash leaves something the reaper finds.
        registry.save(record)
        sandbox = cls(record=record, registry=registry, settings=settings)
        try:
            sandbox._prepare(spec, limits)
            sandbox._start(spec, limits)
        except BaseException:
            sandbox.close()
            raise
        return sandbox

    @classmethod
    def _workdir(cls, spec: SandboxSpec, sdir: Path) -> str:
        return spec.workdir

    def _prepare(self, spec: SandboxSpec, limits: dict[str, Any]) -> None:
        sdir = Path(self.record.dir)
        (sdir / "snapshots").mkdir(parents=True, exist_ok=True)
        self._prepare_disk(limits["disk_mb"])
        for sub in ("workspace", "tmp", "run"):
            (self.fs / sub).mkdir(parents=True, exist_ok=True)
        self._fill_workspace(spec, limits, seed=True)
        for sub in ("tmp", "run"):  # what the sandbox's user writes; the rest stays ours
            self._chown_tree(self.fs / sub)
        if self.settings.use_cgroups and self.own_cgroups:
            try:
                self._cgroups = Cgroups.create(
                    f"farm-{self.id}",
                    root=self.settings.cgroup_root,
                    memory_mb=limits["memory_mb"],
                    pids=limits["pids"],
                    cpus=limits["cpus"],
                )
            except OSError as exc:
                log.warning("sandbox %s: cgroups not writable (%s): limits fall back to rlimits", self.id, exc)
        self.record.cgroups = {k: str(v) for k, v in self._cgroups.dirs.items()}
        self.registry.save(self.record)

    def _seed_workspace(self, spec: SandboxSpec) -> None:
        """Put what the workspace starts from before the spec's own files (an image's copy of it)."""

    def _fill_workspace(self, spec: SandboxSpec, limits: dict[str, Any], *, seed: bool = False) -> None:
        """Copy the spec's workspace and snapshot in (over the image's copy of it when ``seed``: at
        creation, not at a warm sandbox's hand-out), owned by the sandbox's user.

        Raises:
            SandboxUnavailable: they do not fit the disk quota.
        """
        try:
            if seed:
                self._seed_workspace(spec)
            if spec.workspace is not None:
                shutil.copytree(spec.workspace, self.host_workspace, symlinks=True, dirs_exist_ok=True)
            if spec.snapshot is not None:
                _extract(spec.snapshot, self.host_workspace)
        except OSError as exc:
            if not _out_of_space(exc):
                raise
            raise SandboxUnavailable(
                f"the workspace does not fit the disk quota of {limits['disk_mb']} MiB: raise limits.disk_mb",
                sandbox_id=self.id,
            ) from exc
        self._chown_tree(self.host_workspace)

    def adopt(self, spec: SandboxSpec) -> None:
        """Make a warm sandbox (started for ``spec``'s shape, empty) the caller's: this process owns
        it, its workspace and snapshot are copied in, its label set, and its hard lifetime counts
        from now (the reaper enforces ``record.deadline``).

        Raises:
            SandboxUnavailable: the workspace does not fit the disk quota.
        """
        limits = resolved_limits(spec, self.settings)
        owner = ProcRef.of(os.getpid())
        assert owner is not None
        self.record.owner = owner
        self.record.label = spec.label
        self.record.deadline = time.time() + limits["wall_time_s"] if limits["wall_time_s"] else None
        self.registry.save(self.record)
        self._fill_workspace(spec, limits)

    def _prepare_disk(self, disk_mb: int | None) -> None:
        """Make ``self.fs`` the quota'd file system (or a plain directory) and record how."""
        mode = self.settings.disk_quota
        if disk_mb and mode != "rlimit":
            try:
                make_loop_fs(Path(self.record.dir), size_mb=disk_mb)
                self.record.disk_quota = "loop"
            except DiskQuotaUnavailable as exc:
                if mode == "loop":
                    raise SandboxUnavailable(
                        f"disk_quota='loop' but no loop-mounted file system can be made here: {exc}",
                        sandbox_id=self.id,
                    ) from exc
                log.warning("sandbox %s: %s; the disk quota falls back to a per-file size limit", self.id, exc)
        if disk_mb and not self.record.disk_quota:
            self.record.disk_quota = "rlimit"
        self.fs.mkdir(parents=True, exist_ok=True)
        self.registry.save(self.record)

    def _sandbox_ids(self) -> tuple[int, int] | None:
        """(uid, gid) commands run as, when it differs from ours (root worker: an unprivileged user)."""
        return None

    def _chown_tree(self, path: Path) -> None:
        ids = self._sandbox_ids()
        if ids is None:
            return
        for dirpath, dirnames, filenames in os.walk(path):
            os.chown(dirpath, *ids, follow_symlinks=False)
            for name in dirnames + filenames:
                os.chown(os.path.join(dirpath, name), *ids, follow_symlinks=False)

    def _server_config(self, spec: SandboxSpec, limits: dict[str, Any], *, socket_path: str) -> dict[str, Any]:
        return {
            "socket_path": socket_path,
            "workspace": self.workdir,
            "env": self._tool_env(spec),
            "output_cap_bytes": spec.output_cap_bytes or self.settings.output_cap_bytes,
            "output_limit_bytes": spec.output_limit_bytes or self.settings.output_limit_bytes,
            # Without a mounted quota, each file a sandbox process writes is capped at the quota instead.
            "fsize_bytes": limits["disk_mb"] * 1024 * 1024 if self.record.disk_quota == "rlimit" else None,
            "tool_timeout_s": spec.tool_timeout_s or self.settings.tool_timeout_s,
            "cpu_time_s": limits["cpu_time_s"],
            "deadline": self.record.deadline,
            "forwards": [
                {"port": f.port, "socket": forward_target(f.port) if self.isolated else str(f.socket)}
                for f in spec.forwards
            ],
        }

    def _tool_env(self, spec: SandboxSpec) -> dict[str, str]:
        return dict(spec.env)

    def _launch(self, spec: SandboxSpec, limits: dict[str, Any]) -> None:
        """Start the execution server; set ``self._popen`` and ``self.record.procs``/``pgids``."""
        raise NotImplementedError

    def _start(self, spec: SandboxSpec, limits: dict[str, Any]) -> None:
        self._launch(spec, limits)
        self.registry.save(self.record)
        ready = Path(self.record.socket_path + ".ready")
        deadline = time.monotonic() + self.settings.start_timeout_s
        while not ready.exists():
            if self._popen is not None and self._popen.poll() is not None:
                raise SandboxUnavailable(
                    f"the {self.driver} sandbox exited at start (code {self._popen.returncode}): {self._log_tail()}",
                    sandbox_id=self.id,
                )
            if time.monotonic() > deadline:
                raise SandboxUnavailable(
                    f"the execution server did not start in {self.settings.start_timeout_s:g} s: {self._log_tail()}",
                    sandbox_id=self.id,
                )
            time.sleep(_READY_POLL_S)

    def _log_path(self) -> Path:
        # Outside the parts bound into the sandbox (the agent cannot forge it), inside the quota
        # (a process writing to the server's stdout through /proc fills the sandbox's disk, not the host's).
        return self.fs / "server.log"

    def _log_tail(self) -> str:
        try:
            return self._log_path().read_text(errors="replace")[-2000:].strip()
        except OSError:
            return "(no log)"

    def _server_argv(self, python: str, config: dict[str, Any]) -> list[str]:
        # -S: no site module, so no .pth files run at start (they cost ~50 ms here and may point
        # outside the sandbox); server_pythonpath() supplies the site-packages directories instead.
        return [python, "-S", "-m", "farm.tools.server", json.dumps(config)]

    # ---- use --------------------------------------------------------------------------------
    @classmethod
    def attach(
        cls, *, registry: Registry, settings: SandboxSettings, sandbox_id: str, claim: bool = True
    ) -> ServerSandbox:
        """Use a sandbox another process created (INIT on one worker, RUN on another).

        Raises:
            SandboxError: no such sandbox on this node.
        """
        record = registry.load(sandbox_id)
        if record is None:
            raise SandboxError("no such sandbox on this node (closed or reaped?)", sandbox_id=sandbox_id)
        sandbox = cls(record=record, registry=registry, settings=settings)
        sandbox.driver = record.driver
        sandbox.isolated = record.driver != "local"
        if claim:
            sandbox.claim()
        return sandbox

    def claim(self) -> None:
        owner = ProcRef.of(os.getpid())
        assert owner is not None
        self.record.owner = owner
        self.registry.save(self.record)

    def tools(self) -> ToolClient:
        if self._closed:
            raise SandboxError("the sandbox is closed", sandbox_id=self.id)
        if self._client is None:
            self._client = ToolClient(socket_path=self.record.socket_path, sandbox_id=self.id, on_result=self._annotate)
        return self._client

    def limit_events(self) -> CgroupEvents:
        """Cumulative OOM kills and refused forks of this sandbox (zeros without cgroups)."""
        return self._cgroups.events()

    def _annotate(self, result: ToolResult) -> None:
        # The kernel tells the host, not the sandbox, why a process died: add it to the result.
        if not self._cgroups.dirs:
            return
        events = self._cgroups.events()
        if events.oom_kills > self._events.oom_kills:
            result.info["oom_killed"] = True
            result.error = (result.error + "; " if result.error else "") + "a process was killed: out of memory"
        if events.pids_limit_hits > self._events.pids_limit_hits:
            result.info["pids_limit_hit"] = True
            result.error = (result.error + "; " if result.error else "") + "process limit reached: fork refused"
        self._events = events

    def run(
        self,
        command: str | list[str],
        *,
        timeout_s: float | None = None,
        cwd: str | None = None,
        env: dict[str, str] | None = None,
    ) -> ExecResult:
        return self.tools().exec(command, timeout_s=timeout_s, cwd=cwd, env=env)

    def put_file(self, path: str, data: bytes, *, mode: int | None = None) -> None:
        self.tools().put_file(path, data, mode=mode)

    def get_file(self, path: str) -> bytes:
        return self.tools().get_file(path)

    def snapshot(self, *, dest: Path | None = None) -> Snapshot:
        now = time.time()
        dest = dest or Path(self.record.dir) / "snapshots" / f"{int(now * 1000)}.tar"
        dest.parent.mkdir(parents=True, exist_ok=True)
        # Stored as the sandbox sees it: symlinks stay links (never followed on the host), sockets skipped.
        with tarfile.open(dest, "w") as tar:
            for entry in sorted(os.listdir(self.host_workspace)):
                tar.add(self.host_workspace / entry, arcname=entry)
        return Snapshot(path=dest, sandbox_id=self.id, created_at=now)

    def restore(self, snapshot: Snapshot | Path) -> None:
        """Raises:
        SandboxError: the snapshot could not be unpacked.
        """
        path = snapshot.path if isinstance(snapshot, Snapshot) else snapshot
        # Unpacked by a command inside the sandbox, as its user: a symlink an agent process plants
        # meanwhile can only lead to what the sandbox itself may write.
        name = f"restore-{uuid.uuid4().hex}.tar"
        staged = self.fs / "run" / name
        shutil.copyfile(path, staged)
        self._chown_tree(staged)
        # An image sandbox runs the host's Python through the host's loader (the record says how).
        python, env = (
            (self.record.python, self.record.python_env) if self.record.python else ([self._python_inside()], {})
        )
        result = self.run([*python, "-c", _RESTORE_SCRIPT, f"{self._run_dir_inside()}/{name}", self.workdir], env=env)
        staged.unlink(missing_ok=True)
        if not result.ok:
            raise SandboxError(f"restore failed: {result.error or ''} {result.output[-2000:]}", sandbox_id=self.id)

    def _run_dir_inside(self) -> str:
        """The server's socket directory as the sandbox sees it."""
        return str(Path(self.record.socket_path).parent) if not self.isolated else RUN_DIR_INSIDE

    def _python_inside(self) -> str:
        return sys.executable

    def detach(self) -> None:
        """Drop this handle's connections; the sandbox keeps running for the next stage."""
        if self._client is not None:
            self._client.close()

    def started_here_and_exited(self) -> bool:
        """True once the server this process started has exited (and is reaped); False otherwise."""
        return self._popen is not None and self._popen.poll() is not None

    # ---- teardown ---------------------------------------------------------------------------
    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        if self._client is not None:
            self._client.close()
        self._cgroups.close_files()
        with self.registry.locked(self.id):
            record = self.registry.load(self.id) or self.record
            self.registry.destroy(record)
        if self._popen is not None:
            self._popen.wait()

    def __enter__(self) -> ServerSandbox:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"<{type(self).__name__} {self.id} driver={self.driver} workdir={self.workdir}>"


#: empties the workspace (keeping the directory: shells have it as cwd) and unpacks a tar into it.
_RESTORE_SCRIPT = """
import os, shutil, sys, tarfile
archive, ws = sys.argv[1], sys.argv[2]
for entry in os.listdir(ws):
    p = os.path.join(ws, entry)
    shutil.rmtree(p) if os.path.isdir(p) and not os.path.islink(p) else os.unlink(p)
with tarfile.open(archive) as tar:
    tar.extractall(ws, filter="data")
"""


def _out_of_space(exc: OSError) -> bool:
    if exc.errno in (errno.ENOSPC, errno.EFBIG):
        return True
    # shutil.copytree gathers per-file failures into one shutil.Error of (src, dst, reason) rows.
    rows = exc.args[0] if isinstance(exc, shutil.Error) and exc.args and isinstance(exc.args[0], list) else []
    return any(os.strerror(errno.ENOSPC) in str(row) or os.strerror(errno.EFBIG) in str(row) for row in rows)


def _extract(archive: Path, dest: Path) -> None:
    # The "data" filter refuses absolute paths, links out of dest and device files.
    with tarfile.open(archive) as tar:
        tar.extractall(dest, filter="data")
