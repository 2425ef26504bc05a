"""The bwrap driver over a task image: the image's root, a private writable layer per sandbox over one
shared unpacked copy, no Python needed in the image, no network, and no mount left on the host."""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path

import pytest

from farm.sandbox import SandboxSpec
from farm.sandbox.server_sandbox import ServerSandbox
from tests.integration.sandbox.conftest import IMAGE_DRIVER

pytestmark = pytest.mark.usefixtures("need_bwrap")


def host_mounts() -> str:
    return Path("/proc/self/mountinfo").read_text()


def test_image_sandbox_runs_over_the_image_without_python(make_sandbox: Callable[..., ServerSandbox]) -> None:
    sandbox = make_sandbox(IMAGE_DRIVER, SandboxSpec(workdir="/srv"))
    tools = sandbox.tools()
    # The image's working directory seeds the workspace; its second layer's whiteout took effect.
    out = tools.bash("cat data.txt; test -e /etc/remove-me || echo removed; command -v python3 || echo no-python")
    assert out.output == "from the image\nremoved\nno-python\n"
    assert tools.editor("view", "/srv/data.txt").ok
    assert "PATH=/usr/local/bin:/usr/bin:/bin" in sandbox.run(["env"]).output  # the image's Env


def test_image_sandbox_writes_are_private(make_sandbox: Callable[..., ServerSandbox]) -> None:
    first, second = make_sandbox(IMAGE_DRIVER), make_sandbox(IMAGE_DRIVER)
    assert first.run("echo mine > /etc/motd && rm /usr/bin/sed && cat /etc/motd").output == "mine\n"
    assert second.run("cat /etc/motd; command -v sed").output.endswith("/usr/bin/sed\n")
    assert "mine" not in second.run("cat /etc/motd 2>&1").output
    # One unpacked copy, never written: the first sandbox's deletion lives in its own layer.
    assert first.record.image == second.record.image
    shared = Path(first.record.dir).parent / "images" / first.record.image / "rootfs"
    assert (shared / "usr" / "bin" / "sed").exists() and not (shared / "etc" / "motd").exists()


def test_image_sandbox_has_no_network(make_sandbox: Callable[..., ServerSandbox]) -> None:
    sandbox = make_sandbox(IMAGE_DRIVER)
    devices = sandbox.run("tail -n +3 /proc/net/dev").output.split()
    assert [d for d in devices if d.endswith(":")] == ["lo:"]


def test_image_sandbox_mount_never_reaches_the_host(make_sandbox: Callable[..., ServerSandbox]) -> None:
    sandbox = make_sandbox(IMAGE_DRIVER)
    merged = str(Path(sandbox.record.dir) / "fs" / "root")
    assert sandbox.run("echo up").output == "up\n"
    # The overlay lives in the sandbox's own mount namespace: the host never sees it, so neither a
    # close nor a SIGKILLed worker can leave it behind.
    assert merged not in host_mounts() and "farm-image" not in host_mounts()
    for proc in sandbox.record.procs:
        proc.kill()
    sandbox.close()
    assert not os.path.exists(sandbox.record.dir)
