"""BwrapSandbox: bubblewrap, no daemon: the host's system directories read-only, or a task's image.

Inside: read-only system dirs and the Python that runs farm, a private writable workspace and
/tmp, new PID/IPC/UTS/cgroup namespaces and, unless the spec asks for the network, a network
namespace with nothing but its own loopback. A root worker's commands run as an unprivileged
uid (``setpriv``), so root-only files stay unreadable even in the bound directories. Limits on
memory, processes and CPU share come from a cgroup the sandbox joins before bwrap starts.
Killing bwrap's PID-namespace init (pid from ``--info-fd``) kills every process inside.

A spec naming an ``image`` (:mod:`farm.sandbox.image`) runs over that image's root file system
instead: unpacked once per node, shared read-only, with an overlay layer of the sandbox's own on
top (in the sandbox's disk quota); the host's Python runs the execution server from
``HOST_INSIDE`` through the host's loader (:mod:`farm.sandbox.hostpython`), so the image needs none.
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
from farm.sandbox.hostpython import HostPython, host_python, inside
from farm.sandbox.image import Image, load_image
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
    image_root: Path | None = None,
    host: HostPython | None = None,
) -> list[str]:
    """The full bwrap command line (pure: unit-tested without running bwrap).

    With ``image_root`` (a writable root made of an image and the sandbox's own layer) the root is
    the image's, the host's directories appear only under ``HOST_INSIDE`` (``host``), and the
    programs bwrap starts (setpriv, the server) run with the host's loader and libraries.
    """
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
    if image_root is not None:
        assert host is not None
        argv += ["--bind", str(image_root), "/"]
        for d in host.binds:
            parents(inside(d))
            argv += ["--ro-bind", d, inside(d)]
        python_dirs = []  # reached through host.binds
    elif spec.root is not None:
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
        setpriv = ["setpriv"] if host is None else host.argv(inside(shutil.which("setpriv") or "/usr/bin/setpriv"))
        argv += [*setpriv, f"--reuid={uid}", f"--regid={gid}", "--clear-groups"]
        argv += ["--inh-caps=-all", "--bounding-set=-all", "--"]
    else:
        argv.append("--")
    return argv + command


class BwrapSandbox(ServerSandbox):
    """A bubblewrap sandbox; see the module docstring for what it isolates."""

    driver = "bwrap"
    isolated = True
    supports_images = True
    #: the spec's image, unpacked (set by ``_prepare``); None: the host's system directories.
    _image: Image | None = None

    def _sandbox_ids(self) -> tuple[int, int] | None:
        if os.geteuid() != 0:
            return None
        return self.settings.sandbox_uid, self.settings.sandbox_gid

    def _tool_env(self, spec: SandboxSpec) -> dict[str, str]:
        if self._image is not None:
            # The image's own environment (its PATH, its language settings); nothing of the host's.
            base = {"PATH": _STD_PATH, "HOME": "/root", "LANG": "C.UTF-8", **self._image.config.env, "TERM": "dumb"}
            return {**base, **spec.env}
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

    # ---- images -----------------------------------------------------------------------------
    def _prepare(self, spec: SandboxSpec, limits: dict[str, Any]) -> None:
        if spec.image is not None:
            if os.geteuid() != 0:
                raise SandboxUnavailable(
                    "image sandboxes need a root worker (the image's writable layer is an overlay mount); "
                    "run the worker as root or use a spec without an image",
                    sandbox_id=self.id,
                )
            cache = self.settings.image_cache_dir or Path(self.record.dir).parent / "images"
            self._image = load_image(
                spec.image,
                cache=cache,
                owner=self._sandbox_ids(),
                docker=self.settings.docker_path,
                docker_host=self.settings.docker_host,
                build_network=self.settings.image_build_network,
            )
            self.record.image = self._image.key
            host = self._host()
            self.record.python = [*host.argv(host.python)]
            self.record.python_env = dict(host.env)
        super()._prepare(spec, limits)
        if self._image is not None:
            for sub in ("upper", "work", "root"):
                (self.fs / sub).mkdir(exist_ok=True)
            self._chown_tree(self.fs / "upper")  # the merged root's own directory: the sandbox user's

    def _seed_workspace(self, spec: SandboxSpec) -> None:
        # The image's copy of the working directory (a repository at its base commit, a task's /app)
        # is where the workspace starts; the spec's own files go over it.
        if self._image is None:
            return
        seed = self._image.rootfs / spec.workdir.lstrip("/")
        if seed.is_dir() and not seed.is_symlink():
            shutil.copytree(seed, self.host_workspace, symlinks=True, dirs_exist_ok=True)

    def _host(self) -> HostPython:
        system = tuple(d for d in self.settings.bwrap_system_dirs if d != "/etc")
        return host_python(system, tuple(_python_dirs()))

    def _overlay_argv(self, argv: list[str]) -> list[str]:
        """Mount the image with this sandbox's writable layer over it in a mount namespace of its own:
        the mount goes with the sandbox's last process, so a crash leaves none behind. Slave
        propagation lets the host's unmounts (other sandboxes' file systems) reach it."""
        assert self._image is not None
        fs = self.fs
        opts = f"lowerdir={self._image.rootfs},upperdir={fs / 'upper'},workdir={fs / 'work'}"
        script = 'mount -t overlay farm-image -o "$1" "$2" || exit 98; shift 2; exec "$@"'
        mount_ns = ["unshare", "--mount", "--propagation", "slave", "--"]
        return [*mount_ns, "/bin/sh", "-c", script, "farm-overlay", opts, str(fs / "root"), *argv]

    def _launch(self, spec: SandboxSpec, limits: dict[str, Any]) -> None:
        bwrap = shutil.which(self.settings.bwrap_path)
        if bwrap is None:
            raise SandboxUnavailable(
                f"bubblewrap ({self.settings.bwrap_path!r}) is not installed: apt-get install bubblewrap",
                sandbox_id=self.id,
            )
        config = self._server_config(spec, limits, socket_path=f"{RUN_DIR_INSIDE}/server.sock")
        host = self._host() if self._image is not None else None
        if host is None:
            python = [sys.executable]
            server_env = {**self._tool_env(spec), "PYTHONPATH": server_pythonpath(FARM_LIB_INSIDE)}
        else:
            python = host.argv(host.python)
            # The server's own environment: its sessions get config["env"] (the image's) instead.
            paths = [inside(p) if p != FARM_LIB_INSIDE else p for p in server_pythonpath(FARM_LIB_INSIDE).split(":")]
            server_env = {**self._tool_env(spec), **dict(host.env), "PYTHONPATH": ":".join(paths)}
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
                command=python[:-1] + self._server_argv(python[-1], config),
                info_fd=info_w,
                seccomp_fd=seccomp_r,
                image_root=self.fs / "root" if host is not None else None,
                host=host,
            )
            if host is not None:
                argv = self._overlay_argv(argv)
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
