"""DockerSandbox: a container per sandbox, where Docker is the norm (a workstation, a cloud VM).

The same execution server as every driver, reached over the same Unix socket: the sandbox's run
directory is bound at ``/run/farm`` and the server listens there, so the host talks to it with
no network at all. A container runs with ``--network none`` (unless the spec asks for the
network), memory/pids/CPU limits from Docker's own cgroups, every capability dropped, no new
privileges, and as the unprivileged uid when the worker is root. The server runs under the host's
static ``tini`` (Docker's own ``docker-init``, bound from the host) so orphans are reaped: Docker's
``--init`` cannot mount it where the host's ``/usr`` is bound read-only.

Without ``spec.image`` the container is an empty image with the host's system directories bound
read-only over it: what the bwrap driver gives, under Docker. With an image, the image is the
root file system (its own layer per container) and the server runs on the host's Python,
bound at ``/opt/farm/host`` and started through the host's dynamic loader, so an image needs no
Python of its own; tools run the image's programs.

Teardown is ``docker rm -f`` (the record's ``stop_argv``), from ``close`` or any reaper.
"""

from __future__ import annotations

import io
import os
import shutil
import subprocess
import sys
import sysconfig
import tarfile
import threading
from pathlib import Path
from typing import Any

from farm.errors import SandboxUnavailable
from farm.sandbox.base import SandboxSpec
from farm.sandbox.bwrap import _STD_PATH, FARM_LIB_INSIDE, BwrapSandbox, _python_dirs, _under
from farm.sandbox.procs import ProcRef
from farm.sandbox.server_sandbox import FARM_SOURCE_DIR, RUN_DIR_INSIDE, ServerSandbox, server_pythonpath

#: the empty image a sandbox without ``spec.image`` runs (made on first use with ``docker import``).
EMPTY_IMAGE = "farm-empty:1"
#: where the host's /usr appears inside an image sandbox (its Python and loader run from there).
HOST_INSIDE = "/opt/farm/host"
#: how long ``docker import`` / ``image inspect`` may take.
DOCKER_CMD_TIMEOUT_S = 120.0
_empty_image_lock = threading.Lock()


def _host_path(path: str) -> str:
    """Where a host file appears in an image sandbox: /usr under HOST_INSIDE, the Python's own
    directories (a venv, a pyenv prefix) at their own paths."""
    return HOST_INSIDE + path if _under(path, ["/usr"]) else path


def host_python() -> dict[str, str]:
    """The host's interpreter, loader and library dirs as an image sandbox sees them."""
    multiarch = sysconfig.get_config_var("MULTIARCH") or ""
    libs = [f"/usr/lib/{multiarch}", "/usr/lib"] if multiarch else ["/usr/lib"]
    libs.append(os.path.join(os.path.realpath(sys.base_prefix), "lib"))
    return {
        "python": _host_path(os.path.realpath(sys.executable)),
        "loader": _host_path(os.path.realpath("/lib64/ld-linux-x86-64.so.2")),
        "library_path": ":".join(_host_path(d) for d in libs),
        "home": _host_path(os.path.realpath(sys.base_prefix)),
    }


def _static_init() -> str | None:
    """The host's static tini (what Docker's ``--init`` runs), if installed under /usr."""
    for name in ("/usr/bin/tini-static", "/usr/bin/docker-init"):
        path = os.path.realpath(name)
        if os.path.isfile(path) and path.startswith("/usr/"):
            return path
    return None


def docker_run_argv(
    *,
    docker: list[str],
    name: str,
    image: str,
    spec: SandboxSpec,
    sandbox_dir: Path,
    limits: dict[str, Any],
    system_dirs: list[str],
    python_dirs: list[str],
    farm_source: Path,
    run_as: tuple[int, int] | None,
    env: dict[str, str],
    command: list[str],
    labels: dict[str, str],
) -> list[str]:
    """The full ``docker run`` command line (pure: unit-tested without Docker)."""
    argv = [*docker, "run", "--rm", "--name", name, "--hostname", "sandbox"]
    argv += ["--cap-drop", "ALL", "--security-opt", "no-new-privileges", "--stop-timeout", "1"]
    for key, value in sorted(labels.items()):
        argv += ["--label", f"{key}={value}"]
    if not spec.network:
        argv += ["--network", "none"]
    if limits["memory_mb"]:
        argv += ["--memory", f"{limits['memory_mb']}m", "--memory-swap", f"{limits['memory_mb']}m"]
    if limits["pids"]:
        argv += ["--pids-limit", str(limits["pids"])]
    if limits["cpus"]:
        argv += ["--cpus", f"{limits['cpus']:g}"]
    if run_as is not None:
        argv += ["--user", f"{run_as[0]}:{run_as[1]}"]

    def bind(source: str | Path, target: str, *, ro: bool = True) -> None:
        argv.extend(["--mount", f"type=bind,source={source},target={target}{',readonly' if ro else ''}"])

    bound: list[str] = []
    if spec.image is None:
        argv.append("--read-only")  # nothing of its own to write: the host's dirs are read-only anyway
        for d in system_dirs:
            if os.path.isdir(d):
                bind(os.path.realpath(d), d)
                bound.append(d)
        for d in python_dirs:
            if not _under(d, bound):
                bind(d, d)
    else:
        bind("/usr", f"{HOST_INSIDE}/usr")
        for d in python_dirs:
            if not _under(d, ["/usr"]):
                bind(d, d)
    bind(farm_source / "farm", f"{FARM_LIB_INSIDE}/farm")
    for b in spec.binds:
        bind(b.source, b.target or str(b.source), ro=b.read_only)
    bind(sandbox_dir / "tmp", "/tmp", ro=False)
    bind(sandbox_dir / "workspace", spec.workdir, ro=False)
    bind(sandbox_dir / "run", RUN_DIR_INSIDE, ro=False)
    for key, value in sorted(env.items()):
        argv += ["--env", f"{key}={value}"]
    argv += ["--workdir", spec.workdir, image]
    return argv + command


class DockerSandbox(BwrapSandbox):
    """A Docker container; see the module docstring. Shares bwrap's uid and tool environment."""

    driver = "docker"
    isolated = True
    #: takes ``SandboxSpec.image`` (a local image name or id; nothing is pulled).
    supports_images = True
    #: Docker makes and removes the container's cgroups itself.
    own_cgroups = False

    def _prepare(self, spec: SandboxSpec, limits: dict[str, Any]) -> None:
        # ``spec.image`` names an image the engine has: nothing for bwrap's image cache to unpack.
        ServerSandbox._prepare(self, spec, limits)

    def _tool_env(self, spec: SandboxSpec) -> dict[str, str]:
        env = super()._tool_env(spec)
        if spec.image is not None and "PATH" not in spec.env:
            env["PATH"] = _STD_PATH  # the image's programs, not the host Python's directory
        return env

    def _docker(self) -> list[str]:
        docker = shutil.which(self.settings.docker_path)
        if docker is None:
            raise SandboxUnavailable(
                f"docker ({self.settings.docker_path!r}) is not installed: apt-get install docker.io "
                "(scripts/setup_docker.sh starts a daemon)",
                sandbox_id=self.id,
            )
        return [docker, "-H", self.settings.docker_host] if self.settings.docker_host else [docker]

    def _image_name(self, docker: list[str], spec: SandboxSpec) -> str:
        if spec.image is not None:
            return spec.image
        with _empty_image_lock:
            found = subprocess.run(
                [*docker, "image", "inspect", EMPTY_IMAGE], capture_output=True, timeout=DOCKER_CMD_TIMEOUT_S
            )
            if found.returncode != 0:
                empty = io.BytesIO()
                tarfile.open(fileobj=empty, mode="w").close()
                made = subprocess.run(
                    [*docker, "import", "-", EMPTY_IMAGE],
                    input=empty.getvalue(),
                    capture_output=True,
                    timeout=DOCKER_CMD_TIMEOUT_S,
                )
                if made.returncode != 0:
                    raise SandboxUnavailable(
                        f"docker cannot make its empty image: {made.stderr.decode(errors='replace').strip()}",
                        sandbox_id=self.id,
                    )
        return EMPTY_IMAGE

    def _launch(self, spec: SandboxSpec, limits: dict[str, Any]) -> None:
        docker = self._docker()
        image = self._image_name(docker, spec)
        config = self._server_config(spec, limits, socket_path=f"{RUN_DIR_INSIDE}/server.sock")
        env = {"PYTHONPATH": server_pythonpath(FARM_LIB_INSIDE)}
        init = _static_init()
        if spec.image is None:
            command = self._server_argv(sys.executable, config)
        else:
            host = host_python()
            env["PYTHONHOME"] = host["home"]
            loader = [host["loader"], "--library-path", host["library_path"]]
            command = loader + self._server_argv(host["python"], config)
            init = HOST_INSIDE + init if init else None
        if init:
            command = [init, "-s", "--", *command]
        name = f"farm-{self.id}"
        argv = docker_run_argv(
            docker=docker,
            name=name,
            image=image,
            spec=spec,
            sandbox_dir=self.fs,
            limits=limits,
            system_dirs=self.settings.bwrap_system_dirs,
            python_dirs=_python_dirs(),
            farm_source=FARM_SOURCE_DIR,
            run_as=self._sandbox_ids(),
            env=env,
            command=command,
            labels={"farm.sandbox": self.id, "farm.root": str(Path(self.record.dir).parent)},
        )
        # Recorded before the container exists: a crash from here on leaves a name the reaper removes.
        self.record.stop_argv = [*docker, "rm", "-f", name]
        self.registry.save(self.record)
        with open(self._log_path(), "ab") as log:
            self._popen = subprocess.Popen(
                argv, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT, start_new_session=True
            )
        client = ProcRef.of(self._popen.pid)
        self.record.procs = [client] if client is not None else []
