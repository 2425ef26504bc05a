"""Harbor tasks as published, Dockerfile and all: environment/Dockerfile built by Docker on the node,
saved, unpacked and run rootless by the bwrap driver. The test runs a Docker engine of its own (a
private socket, no bridge, no iptables rules) and makes the tasks' base image from the host's
binaries, since no registry is reachable."""

from __future__ import annotations

import contextlib
import shutil
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from farm.agent.toolcalls import format_call
from farm.config import Settings
from farm.handlers.registry import get_handler
from farm.testing import run_stages
from farm.testing.images import host_image
from farm.worker.sandboxes import SandboxResources

TB_TASKS = Path(__file__).parent / "tb_tasks"
DOCKER = "/usr/bin/docker"

pytestmark = pytest.mark.compose


@pytest.fixture(scope="module")
def docker_host(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    if shutil.which("dockerd") is None or not Path(DOCKER).exists():
        pytest.fail("Docker is not installed (scripts/setup_docker.sh installs it)")
    tmp = tmp_path_factory.mktemp("dockerd")
    host = f"unix://{tmp}/docker.sock"
    argv = [
        "dockerd", "--host", host, "--data-root", str(tmp / "data"), "--exec-root", str(tmp / "exec"),
        "--pidfile", str(tmp / "dockerd.pid"), "--bridge=none", "--iptables=false", "--ip6tables=false",
        "--storage-driver=overlay2",
    ]  # fmt: skip
    with open(tmp / "dockerd.log", "wb") as log:
        daemon = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + 60
        while subprocess.run([DOCKER, "-H", host, "info"], capture_output=True).returncode != 0:
            assert daemon.poll() is None and time.monotonic() < deadline, (tmp / "dockerd.log").read_text()[-2000:]
            time.sleep(0.5)
        base = host_image(tmp / "base.tar")
        subprocess.run([DOCKER, "-H", host, "load", "-i", str(base)], check=True, capture_output=True)
        subprocess.run([DOCKER, "-H", host, "tag", "farm-test:latest", "farm-test-base"], check=True)
        yield host
    finally:
        daemon.terminate()
        with contextlib.suppress(subprocess.TimeoutExpired):
            daemon.wait(timeout=30)
        if daemon.poll() is None:
            daemon.kill()
            daemon.wait()


@pytest.mark.parametrize("name", ["fix-greeting", "word-count"])
def test_harbor_task_built_from_its_dockerfile(
    name: str, docker_host: str, tiny_tokenizer: Any, tmp_path: Path
) -> None:
    settings = Settings(
        data_dir=tmp_path / "data",
        sandbox={"root_dir": tmp_path / "sb", "docker_path": DOCKER, "docker_host": docker_host,
                 "image_build_network": "none"},
    )  # fmt: skip
    sandboxes = SandboxResources(settings)
    config = {"path": str(TB_TASKS / name), "image": "build"}
    solve = (TB_TASKS / name / "solution" / "solve.sh").read_text()
    handler = get_handler("harbor")
    solved = run_stages(
        handler, config, [format_call("bash", {"command": solve}), format_call("submit", {})],
        sandboxes=sandboxes, tokenizer=tiny_tokenizer,
    )  # fmt: skip
    assert solved.eval is not None and solved.eval.reward == 1.0, solved.eval
    untouched = run_stages(handler, config, [format_call("submit", {})], sandboxes=sandboxes, tokenizer=tiny_tokenizer)
    assert untouched.eval is not None and untouched.eval.reward == 0.0, untouched.eval
