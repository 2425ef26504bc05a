"""The docker driver's command line, built without Docker."""

from __future__ import annotations

from pathlib import Path

from farm.sandbox.base import Bind, SandboxSpec
from farm.sandbox.docker import HOST_INSIDE, docker_run_argv

LIMITS = {"memory_mb": 512, "pids": 64, "cpus": 1.5, "cpu_time_s": None, "wall_time_s": None, "disk_mb": None}


def _argv(spec: SandboxSpec, **kw: object) -> list[str]:
    args: dict[str, object] = {
        "docker": ["docker", "-H", "unix:///d.sock"],
        "name": "farm-abc",
        "image": spec.image or "farm-empty:1",
        "spec": spec,
        "sandbox_dir": Path("/sb/abc/fs"),
        "limits": LIMITS,
        "system_dirs": ["/usr", "/etc"],
        "python_dirs": ["/usr", "/opt/venv"],
        "farm_source": Path("/src"),
        "run_as": (65534, 65534),
        "env": {"PYTHONPATH": "/opt/farm/lib"},
        "command": ["python", "-S", "-m", "farm.tools.server", "{}"],
        "labels": {"farm.sandbox": "abc"},
    }
    args.update(kw)
    return docker_run_argv(**args)  # type: ignore[arg-type]


def _pairs(argv: list[str], flag: str) -> list[str]:
    return [argv[i + 1] for i, a in enumerate(argv) if a == flag]


def test_docker_argv_has_no_network_limits_and_no_privileges() -> None:
    argv = _argv(SandboxSpec())
    assert argv[:4] == ["docker", "-H", "unix:///d.sock", "run"]
    assert _pairs(argv, "--network") == ["none"]
    assert _pairs(argv, "--memory") == ["512m"] and _pairs(argv, "--memory-swap") == ["512m"]
    assert _pairs(argv, "--pids-limit") == ["64"] and _pairs(argv, "--cpus") == ["1.5"]
    assert _pairs(argv, "--user") == ["65534:65534"] and _pairs(argv, "--cap-drop") == ["ALL"]
    assert "no-new-privileges" in _pairs(argv, "--security-opt")
    assert argv[-5:] == ["python", "-S", "-m", "farm.tools.server", "{}"]


def test_docker_argv_network_only_when_asked() -> None:
    assert "--network" not in _argv(SandboxSpec(network=True))


def test_docker_argv_binds_the_socket_dir_and_workspace_writable_the_host_read_only() -> None:
    mounts = _pairs(_argv(SandboxSpec(binds=[Bind(source=Path("/data"), target="/data")])), "--mount")
    assert "type=bind,source=/sb/abc/fs/run,target=/run/farm" in mounts
    assert "type=bind,source=/sb/abc/fs/workspace,target=/workspace" in mounts
    assert "type=bind,source=/usr,target=/usr,readonly" in mounts
    assert "type=bind,source=/opt/venv,target=/opt/venv,readonly" in mounts
    assert "type=bind,source=/data,target=/data,readonly" in mounts


def test_docker_argv_of_an_image_keeps_its_root_and_puts_the_host_python_aside() -> None:
    argv = _argv(SandboxSpec(image="task:1"))
    mounts = _pairs(argv, "--mount")
    assert f"type=bind,source=/usr,target={HOST_INSIDE}/usr,readonly" in mounts
    assert "type=bind,source=/usr,target=/usr,readonly" not in mounts
    assert "--read-only" not in argv and "task:1" in argv
