"""Fixtures for tests that start real sandboxes (bwrap needs Debian's ``bubblewrap``)."""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from farm.config import Settings
from farm.sandbox import SandboxSpec, create_sandbox
from farm.sandbox.server_sandbox import ServerSandbox

IN_CI = bool(os.environ.get("CI"))
#: drivers the contract suite runs against here (singularity has its own opt-in tests; docker needs
#: a dockerd: --run-docker).
RUNNABLE_DRIVERS = ["bwrap", "local", "bwrap-image", pytest.param("docker", marks=pytest.mark.docker)]
#: the contract suite's name for a bwrap sandbox over a small image (``small_image``).
IMAGE_DRIVER = "bwrap-image"
#: the repository root (scripts/setup_docker.sh).
_ROOT = Path(__file__).resolve().parents[3]
#: the file scripts/setup_docker.sh records the dockerd it starts in.
_DOCKERD_PIDFILE = Path(os.environ.get("FARM_DOCKERD_PIDFILE", "/run/rollout-farm-dockerd.pid"))


def _docker_answers(host: str | None) -> bool:
    argv = ["docker", *(["-H", host] if host else []), "info"]
    try:
        return subprocess.run(argv, capture_output=True, timeout=30).returncode == 0
    except (FileNotFoundError, subprocess.TimeoutExpired):
        return False


@pytest.fixture(scope="session")
def docker_host() -> Iterator[str | None]:
    """The daemon the docker driver talks to: $FARM_TEST_DOCKER_HOST, the one that answers, or one
    scripts/setup_docker.sh starts here (and stops at the end)."""
    host = os.environ.get("FARM_TEST_DOCKER_HOST") or None
    if host is not None or _docker_answers(None):
        if not _docker_answers(host):
            pytest.fail(f"no Docker engine answers at {host}")
        yield host
        return
    if os.geteuid() != 0:
        pytest.fail("the docker driver tests start Docker with scripts/setup_docker.sh: run as root")
    started_here = not _DOCKERD_PIDFILE.exists()
    subprocess.run(["scripts/setup_docker.sh"], cwd=_ROOT, check=True, capture_output=True, timeout=600)
    try:
        yield None
    finally:
        if started_here:
            subprocess.run(["scripts/setup_docker.sh", "--stop"], cwd=_ROOT, check=False, timeout=120)


def require_bwrap() -> None:
    """Skip locally, fail in CI: a missing bubblewrap must never turn CI green."""
    if shutil.which("bwrap") is None:
        message = "bubblewrap is not installed (apt-get install bubblewrap)"
        if IN_CI:
            pytest.fail(message)
        pytest.skip(message)


def cgroups_writable(root: Path = Path("/sys/fs/cgroup")) -> bool:
    probe = root / "pids" / f"farm-probe-{os.getpid()}"
    if (root / "cgroup.controllers").exists():
        probe = root / f"farm-probe-{os.getpid()}"
    try:
        probe.mkdir()
    except OSError:
        return False
    probe.rmdir()
    return True


@pytest.fixture
def sandbox_settings(tmp_path: Path) -> Settings:
    return Settings(
        data_dir=tmp_path / "data",
        sandbox={"root_dir": tmp_path / "sb", "tool_timeout_s": 20.0, "memory_mb": 1024, "pids": 256},
    )


@pytest.fixture(scope="session")
def small_image(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A docker-save archive of the host's bash and coreutils (no Python): see farm.testing.images."""
    from farm.testing.images import host_image

    return host_image(tmp_path_factory.mktemp("image") / "small.tar", files={"/srv/data.txt": "from the image\n"})


@pytest.fixture
def make_sandbox(sandbox_settings: Settings, request: pytest.FixtureRequest) -> Iterator[Callable[..., ServerSandbox]]:
    made: list[ServerSandbox] = []

    def make(driver: str, spec: SandboxSpec | None = None) -> ServerSandbox:
        settings = sandbox_settings
        if driver == IMAGE_DRIVER:  # the bwrap driver over an image instead of the host's directories
            if os.geteuid() != 0:
                pytest.skip("image sandboxes need a root worker (overlayfs)")
            image = request.getfixturevalue("small_image")  # built only when a test asks for it
            spec = (spec or SandboxSpec()).model_copy(update={"image": str(image)})
            driver = "bwrap"
        if driver == "bwrap":
            require_bwrap()
        if driver == "docker":
            host = request.getfixturevalue("docker_host")
            settings = settings.model_copy(
                update={"sandbox": settings.sandbox.model_copy(update={"docker_host": host})}
            )
        sandbox = create_sandbox(settings, spec, driver=driver)
        made.append(sandbox)
        return sandbox

    yield make
    for sandbox in made:
        sandbox.close()


@pytest.fixture(
    params=[pytest.param(d, marks=pytest.mark.images) if d == IMAGE_DRIVER else d for d in RUNNABLE_DRIVERS]
)
def driver(request: pytest.FixtureRequest) -> str:
    return str(request.param)


@pytest.fixture
def sandbox(make_sandbox: Callable[..., ServerSandbox], driver: str) -> ServerSandbox:
    return make_sandbox(driver)


@pytest.fixture
def need_bwrap() -> None:
    require_bwrap()


@pytest.fixture
def need_cgroups() -> None:
    if not cgroups_writable():
        message = "cgroups are not writable here: process and memory limits cannot be enforced"
        if IN_CI:
            pytest.fail(message)
        pytest.skip(message)


#: the repository, for the PYTHONPATH of owner processes.
REPO = Path(__file__).resolve().parents[3]


@contextlib.contextmanager
def sandbox_owner(script: str, settings: Settings) -> Iterator[subprocess.Popen[str]]:
    """A separate process (a stand-in for a worker) running ``script`` with the data and sandbox
    directories as its arguments; it prints one JSON line and waits on stdin. Killed (if the
    test has not) and its pipes closed on exit."""
    worker = subprocess.Popen(
        [sys.executable, "-c", script, str(settings.data_dir), str(settings.sandbox.root_dir)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        env={**os.environ, "PYTHONPATH": str(REPO)},
        text=True,
    )
    try:
        yield worker
    finally:
        if worker.poll() is None:
            worker.kill()
            worker.wait()
        for pipe in (worker.stdin, worker.stdout):
            if pipe is not None:
                pipe.close()
