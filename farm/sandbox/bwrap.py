"""BwrapSandbox: bubblewrap, no daemon and no image: the host's system directories, read-only.

Inside: read-only system dirs and the Python that runs farm, a private writable workspace and
/tmp, new PID/IPC/UTS/cgroup namespaces and, unless the spec asks for the network, a network
namespace with nothing but its own loopback. A root worker's commands run as an unprivileged
uid (``setpriv``), so root-only files stay unreadable even in the bound directories. Limits on
memory, processes and CPU share come from a cgroup the sandbox joins before bwrap starts.
Killing bwrap's PID-namespace init (pid from ``--info-fd``) kills every process inside.
"""

from __future__ import annotations

import json
import logging
import os
import platform
import select
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from farm.errors import SandboxUnavailable
from farm.sandbox.base import SandboxSpec
from farm.sandbox.procs import ProcRef, enter_cgroups_argv
from farm.sandbox.seccomp import filter_program
from farm.sandbox.server_sandbox import FARM_SOURCE_DIR, RUN_DIR_INSIDE, ServerSandbox, server_pythonpath

log = logging.getLogger(__name__)

#: where the farm package is bound inside.
FARM_LIB_INSIDE = "/opt/farm/lib"
#: how long bwrap may take to report its namespace init's pid.
INFO_TIMEOUT_S = 10.0
_STD_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"


def _python_dirs() -> list[str]:
    dirs = {os.path.realpath(sys.base_prefix), os.path.realpath(sys.prefix)}
    return sorted(dirs)


def _under(path: str, roots: list[str]) -> bool:
    return any(path == r or path.startswith(r.rstrip("/") + "/") for r in roots)


def bwrap_argv(
    *,
    bwrap: str,
    spec: SandboxSpec,
    sandbox_dir: Path,
    system_dirs: list[str],
    python_dirs: list[str],
    farm_source: Path,
    run_as: tuple[int, int] | None,
    command: list[str],
    info_fd: int | None = None,
    seccomp_fd: int | None = None,
) -> list[str]:
    """The full bwrap command line (pure: unit-tested without running bwrap)."""
    argv = [bwrap]
    made: set[str] = {"/"}

    def parents(dest: str) -> None:
        # bwrap would create missing parents mode 0700: unreadable for the unprivileged uid.
        parts = Path(dest).parts[1:-1]
        for i in range(len(parts)):
            d = "/" + "/".join(parts[: i + 1])
            if d not in made:
                argv.extend(["--perms", "0755", "--dir", d])
                made.add(d)

    bound: list[str] = []
    if spec.root is not None:
        argv += ["--ro-bind", str(spec.root), "/"]
    else:
        for d in system_dirs:
            if os.path.islink(d):
                argv += ["--symlink", os.readlink(d), d]
            elif os.path.isdir(d):
                argv += ["--ro-bind", d, d]
                bound.append(d)
            made.add(d)
    # /tmp first: a Python that lives under /tmp (a virtual environment, say) is bound on top of it.
    argv += ["--bind", str(sandbox_dir / "tmp"), "/tmp"]
    made.add("/tmp")
    for d in python_dirs:
        if not _under(d, bound):
            parents(d)
            argv += ["--ro-bind", d, d]
            made.add(d)
    parents(f"{FARM_LIB_INSIDE}/farm")
    argv += ["--ro-bind", str(farm_source / "farm"), f"{FARM_LIB_INSIDE}/farm"]
    for b in spec.binds:
        target = b.target or str(b.source)
        parents(target)
        argv += ["--ro-bind" if b.read_only else "--bind", str(b.source), target]
    parents(spec.workdir)
    argv += ["--bind", str(sandbox_dir / "workspace"), spec.workdir]
    parents(f"{RUN_DIR_INSIDE}/x")
    argv += ["--bind", str(sandbox_dir / "run"), RUN_DIR_INSIDE]
    argv += ["--proc", "/proc", "--dev", "/dev"]
    argv += ["--unshare-pid", "--unshare-ipc", "--unshare-uts", "--unshare-cgroup-try"]
    if not spec.network:
        argv.append("--unshare-net")
    argv += ["--hostname", "sandbox", "--new-session", "--chdir", spec.workdir]
    if info_fd is not None:
        argv += ["--info-fd", str(info_fd)]
    if seccomp_fd is not None:
        argv += ["--seccomp", str(seccomp_fd)]
    if run_as is not None:
        uid, gid = run_as
        # bwrap keeps only these two capabilities, and setpriv drops them when it changes uid.
        argv += ["--cap-add", "CAP_SETUID", "--cap-add", "CAP_SETGID", "--"]
        argv += ["setpriv", f"--reuid={uid}", f"--regid={gid}", "--clear-groups"]
        argv += ["--inh-caps=-all", "--bounding-set=-all", "--"]
    else:
        argv.append("--")
    return argv + command


class BwrapSandbox(ServerSandbox):
    """A bubblewrap sandbox; see the module docstring for what it isolates."""

    driver = "bwrap"
    isolated = True

    def _sandbox_ids(self) -> tuple[int, int] | None:
        if os.geteuid() != 0:
            return None
        return self.settings.sandbox_uid, self.settings.sandbox_gid

    def _tool_env(self, spec: SandboxSpec) -> dict[str, str]:
        env = {
            "PATH": f"{os.path.dirname(sys.executable)}:{_STD_PATH}",
            "HOME": "/tmp",
            "LANG": "C.UTF-8",
            "TERM": "dumb",
            "PYTHONDONTWRITEBYTECODE": "1",
            "IPYTHONDIR": "/tmp/.ipython",
            "JUPYTER_RUNTIME_DIR": "/tmp/.jupyter-runtime",
            "MPLCONFIGDIR": "/tmp/.matplotlib",
        }
        return {**env, **spec.env}

    def _launch(self, spec: SandboxSpec, limits: dict[str, Any]) -> None:
        bwrap = shutil.which(self.settings.bwrap_path)
        if bwrap is None:
            raise SandboxUnavailable(
                f"bubblewrap ({self.settings.bwrap_path!r}) is not installed: apt-get install bubblewrap",
                sandbox_id=self.id,
            )
        config = self._server_config(spec, limits, socket_path=f"{RUN_DIR_INSIDE}/server.sock")
        server_env = {**self._tool_env(spec), "PYTHONPATH": server_pythonpath(FARM_LIB_INSIDE)}
        info_r, info_w = os.pipe()
        seccomp_r = self._seccomp_fd()
        try:
            argv = bwrap_argv(
                bwrap=bwrap,
                spec=spec,
                sandbox_dir=self.fs,
                system_dirs=self.settings.bwrap_system_dirs,
                python_dirs=_python_dirs(),
                farm_source=FARM_SOURCE_DIR,
                run_as=self._sandbox_ids(),
                command=self._server_argv(sys.executable, config),
                info_fd=info_w,
                seccomp_fd=seccomp_r,
            )
            argv = self._limit_wrapper(limits) + enter_cgroups_argv(self._cgroups.procs_files, argv)
            with open(self._log_path(), "ab") as log:
                self._popen = subprocess.Popen(
                    argv,
                    env=server_env,
                    stdin=subprocess.DEVNULL,
                    stdout=log,
                    stderr=subprocess.STDOUT,
                    pass_fds=(info_w,) if seccomp_r is None else (info_w, seccomp_r),
                    start_new_session=True,
                )
            os.close(info_w)
            info_w = -1
            outer = ProcRef.of(self._popen.pid)
            self.record.procs = [p for p in (outer,) if p is not None]
            self.registry.save(self.record)
            child = self._read_child_pid(info_r)
            if child is not None:
                self.record.procs.append(child)
        finally:
            os.close(info_r)
            if info_w >= 0:
                os.close(info_w)
            if seccomp_r is not None:
                os.close(seccomp_r)

    def _seccomp_fd(self) -> int | None:
        """A pipe holding the compiled filter for bwrap to read, or None (disabled, or not x86_64)."""
        program = filter_program() if self.settings.bwrap_seccomp else None
        if program is None:
            if self.settings.bwrap_seccomp:
                log.warning("sandbox %s: no seccomp filter for %s", self.id, platform.machine())
            return None
        r, w = os.pipe()
        os.write(w, program)  # a few hundred bytes: fits the pipe buffer, bwrap reads to EOF
        os.close(w)
        return r

    def _limit_wrapper(self, limits: dict[str, Any]) -> list[str]:
        # Without cgroups, per-process rlimits are the fallback (RLIMIT_NPROC binds the unprivileged uid).
        if self._cgroups.dirs or shutil.which("prlimit") is None:
            return []
        opts = []
        if limits["memory_mb"]:
            opts.append(f"--as={limits['memory_mb'] * 1024 * 1024}")
        if limits["pids"]:
            opts.append(f"--nproc={limits['pids']}")
        return ["prlimit", *opts, "--"] if opts else []

    def _read_child_pid(self, fd: int) -> ProcRef | None:
        data = b""
        deadline = time.monotonic() + INFO_TIMEOUT_S
        while time.monotonic() < deadline:
            ready, _, _ = select.select([fd], [], [], 0.05)
            if ready:
                chunk = os.read(fd, 4096)
                if not chunk:
                    break
                data += chunk
                try:
                    pid = int(json.loads(data)["child-pid"])
                except (ValueError, KeyError):
                    continue
                return ProcRef.of(pid)
            if self._popen is not None and self._popen.poll() is not None:
                break
        return None
