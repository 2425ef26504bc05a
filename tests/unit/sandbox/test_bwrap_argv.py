from __future__ import annotations

from pathlib import Path

from farm.sandbox.base import Bind, SandboxSpec
from farm.sandbox.bwrap import FARM_LIB_INSIDE, bwrap_argv
from farm.sandbox.server_sandbox import RUN_DIR_INSIDE


def _argv(spec: SandboxSpec, *, run_as: tuple[int, int] | None = (65534, 65534)) -> list[str]:
    return bwrap_argv(
        bwrap="/usr/bin/bwrap",
        spec=spec,
        sandbox_dir=Path("/sb/x"),
        system_dirs=["/usr", "/etc"],
        python_dirs=["/opt/py/3.11"],
        farm_source=Path("/src"),
        run_as=run_as,
        command=["python", "-m", "farm.tools.server", "{}"],
        info_fd=5,
    )


def _pairs(argv: list[str], flag: str) -> list[tuple[str, str]]:
    return [(argv[i + 1], argv[i + 2]) for i, a in enumerate(argv) if a == flag]


def test_bwrap_argv_isolates_namespaces_and_network_by_default() -> None:
    argv = _argv(SandboxSpec())
    for flag in ("--unshare-pid", "--unshare-ipc", "--unshare-uts", "--unshare-net", "--new-session"):
        assert flag in argv
    assert argv[argv.index("--info-fd") + 1] == "5"


def test_bwrap_argv_network_on_request_keeps_host_network() -> None:
    assert "--unshare-net" not in _argv(SandboxSpec(network=True))


def test_bwrap_argv_binds_system_read_only_and_workspace_tmp_writable() -> None:
    argv = _argv(SandboxSpec(workdir="/work/repo"))
    ro = _pairs(argv, "--ro-bind")
    rw = _pairs(argv, "--bind")
    assert ("/usr", "/usr") in ro and ("/etc", "/etc") in ro
    assert ("/opt/py/3.11", "/opt/py/3.11") in ro
    assert ("/src/farm", f"{FARM_LIB_INSIDE}/farm") in ro
    assert rw == [("/sb/x/tmp", "/tmp"), ("/sb/x/workspace", "/work/repo"), ("/sb/x/run", RUN_DIR_INSIDE)]
    assert argv[argv.index("--chdir") + 1] == "/work/repo"


def test_bwrap_argv_makes_parent_dirs_traversable() -> None:
    argv = _argv(SandboxSpec())
    made = [argv[i + 3] for i, a in enumerate(argv) if a == "--perms" and argv[i + 2] == "--dir"]
    assert ["/opt", "/opt/py"] == made[:2]
    assert all(argv[i + 1] == "0755" for i, a in enumerate(argv) if a == "--perms")


def test_bwrap_argv_binds_a_python_under_tmp_over_the_private_tmp() -> None:
    # A virtual environment in /tmp must stay visible: bwrap applies binds in order.
    argv = bwrap_argv(
        bwrap="bwrap",
        spec=SandboxSpec(),
        sandbox_dir=Path("/sb/x"),
        system_dirs=[],
        python_dirs=["/tmp/venv"],
        farm_source=Path("/src"),
        run_as=None,
        command=["python"],
    )
    order = [argv[i + 2] for i, a in enumerate(argv) if a in ("--bind", "--ro-bind")]
    assert order.index("/tmp/venv") > order.index("/tmp")


def test_bwrap_argv_extra_binds_keep_their_mode() -> None:
    spec = SandboxSpec(binds=[Bind(source=Path("/data")), Bind(source=Path("/out"), target="/o", read_only=False)])
    argv = _argv(spec)
    assert ("/data", "/data") in _pairs(argv, "--ro-bind")
    assert ("/out", "/o") in _pairs(argv, "--bind")


def test_bwrap_argv_drops_to_unprivileged_uid_when_root() -> None:
    argv = _argv(SandboxSpec())
    tail = argv[argv.index("setpriv") :]
    assert tail[:4] == ["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups"]
    assert tail[-4:] == ["python", "-m", "farm.tools.server", "{}"]
    assert "CAP_SETUID" in argv


def test_bwrap_argv_without_uid_change_runs_command_directly() -> None:
    argv = _argv(SandboxSpec(), run_as=None)
    assert "setpriv" not in argv and "--cap-add" not in argv
    assert argv[argv.index("--") + 1 :] == ["python", "-m", "farm.tools.server", "{}"]


def test_bwrap_argv_custom_root_replaces_system_dirs() -> None:
    argv = _argv(SandboxSpec(root=Path("/images/debian")))
    ro = _pairs(argv, "--ro-bind")
    assert ro[0] == ("/images/debian", "/")
    assert ("/usr", "/usr") not in ro


def test_bwrap_argv_passes_the_seccomp_fd() -> None:
    argv = bwrap_argv(
        bwrap="bwrap",
        spec=SandboxSpec(),
        sandbox_dir=Path("/sb/x"),
        system_dirs=[],
        python_dirs=[],
        farm_source=Path("/src"),
        run_as=None,
        command=["true"],
        seccomp_fd=7,
    )
    assert argv[argv.index("--seccomp") + 1] == "7"


def test_seccomp_program_is_whole_instructions_with_valid_jumps() -> None:
    import platform
    import struct

    from farm.sandbox.seccomp import filter_program

    program = filter_program()
    if platform.machine() != "x86_64":
        assert program is None
        return
    assert program is not None and len(program) % 8 == 0
    instructions = [struct.unpack("=HBBI", program[i : i + 8]) for i in range(0, len(program), 8)]
    for index, (code, jt, jf, _) in enumerate(instructions):
        if code & 0x07 == 0x05:  # BPF_JMP: both targets inside the program
            assert index + 1 + max(jt, jf) < len(instructions)
    assert instructions[-1][0] == 0x06  # ends with a return
