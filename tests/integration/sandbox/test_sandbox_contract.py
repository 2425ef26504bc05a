"""One suite, every driver that runs here: what the agent loop and the evaluators rely on."""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from farm.errors import SandboxError
from farm.sandbox import SandboxSpec, attach_sandbox, reap_sandboxes
from farm.sandbox.base import Limits, Sandbox
from farm.sandbox.procs import proc_start_time
from farm.sandbox.server_sandbox import ServerSandbox
from tests.integration.sandbox.conftest import IMAGE_DRIVER


def test_sandbox_satisfies_protocol_and_reports_isolation(sandbox: ServerSandbox, driver: str) -> None:
    assert isinstance(sandbox, Sandbox)
    assert sandbox.isolated == (driver != "local")


def test_run_returns_output_exit_code_as_data(sandbox: ServerSandbox) -> None:
    result = sandbox.run("echo out; echo err >&2; exit 3")
    assert result.exit_code == 3
    assert result.output == "out\nerr\n"
    assert not result.timed_out


def test_run_starts_in_workdir_and_does_not_touch_the_shell(sandbox: ServerSandbox) -> None:
    tools = sandbox.tools()
    tools.bash("cd / && export MARK=1")
    assert sandbox.run("pwd").output == f"{sandbox.workdir}\n"
    assert tools.bash('pwd; echo "$MARK"').output == "/\n1\n"


def test_run_timeout_is_reported(sandbox: ServerSandbox) -> None:
    result = sandbox.run("sleep 30", timeout_s=0.5)
    assert result.timed_out and result.exit_code is None
    assert sandbox.run("echo ok").output == "ok\n"


def test_put_and_get_file_round_trip(sandbox: ServerSandbox) -> None:
    data = bytes(range(256)) * 100
    sandbox.put_file("deep/dir/blob.bin", data)
    assert sandbox.get_file("deep/dir/blob.bin") == data
    assert sandbox.run("wc -c < deep/dir/blob.bin").output.strip() == str(len(data))


def test_get_missing_file_raises_sandbox_error(sandbox: ServerSandbox) -> None:
    with pytest.raises(SandboxError, match="No such file"):
        sandbox.get_file("missing.txt")


def test_workspace_seeded_from_host_dir(
    make_sandbox: Callable[..., ServerSandbox], driver: str, tmp_path: Path
) -> None:
    seed = tmp_path / "seed"
    (seed / "pkg").mkdir(parents=True)
    (seed / "pkg" / "mod.py").write_text("VALUE = 7\n")
    sandbox = make_sandbox(driver, SandboxSpec(workspace=seed))
    assert sandbox.run("cat pkg/mod.py").output == "VALUE = 7\n"
    sandbox.run("echo changed > pkg/mod.py")
    assert (seed / "pkg" / "mod.py").read_text() == "VALUE = 7\n"


def test_snapshot_restore_and_new_sandbox_from_snapshot(
    make_sandbox: Callable[..., ServerSandbox], driver: str
) -> None:
    sandbox = make_sandbox(driver)
    sandbox.run("mkdir -p src && echo original > src/a.txt && ln -s src/a.txt link")
    snap = sandbox.snapshot()
    sandbox.run("echo agent-edit > src/a.txt && rm link && touch extra")
    sandbox.restore(snap)
    assert sandbox.run("cat src/a.txt; readlink link; ls").output == "original\nsrc/a.txt\nlink\nsrc\n"
    fresh = make_sandbox(driver, SandboxSpec(snapshot=snap.path))
    assert fresh.run("cat link").output == "original\n"


def test_bash_state_persists(sandbox: ServerSandbox) -> None:
    tools = sandbox.tools()
    tools.bash("mkdir -p d && cd d && X=5 && alias ll='echo aliased'")
    result = tools.bash("pwd; echo $X")
    assert result.output == f"{sandbox.workdir}/d\n5\n"


def test_bash_timeout_then_working_shell(sandbox: ServerSandbox) -> None:
    tools = sandbox.tools()
    tools.bash("export KEEP=yes")
    result = tools.bash("sleep 60", timeout_s=0.5)
    assert result.timed_out
    assert tools.bash("echo $KEEP").output == "yes\n"


def test_bash_big_output_truncated(make_sandbox: Callable[..., ServerSandbox], driver: str) -> None:
    sandbox = make_sandbox(driver, SandboxSpec(output_cap_bytes=2000))
    result = sandbox.tools().bash("seq 1 200000")
    assert result.truncated
    assert result.output.startswith("1\n2\n") and result.output.endswith("199999\n200000\n")
    assert len(result.output) < 2200


def test_ipython_state_error_and_interrupt(sandbox: ServerSandbox, driver: str) -> None:
    if driver == IMAGE_DRIVER:
        pytest.skip("the small image has no Python: the IPython tool runs on the image's own (docs/sandbox.md)")
    tools = sandbox.tools()
    assert tools.ipython("import os\nv = 6 * 7").ok
    assert tools.ipython("v").output == "42\n"
    err = tools.ipython("undefined_name")
    assert err.exit_code == 1 and "NameError" in err.output and "\x1b[" not in err.output
    slow = tools.ipython("import time; time.sleep(60)", timeout_s=1)
    assert slow.timed_out
    assert tools.ipython("v + 1").output == "43\n"


def test_editor_operations_and_bad_edit(sandbox: ServerSandbox) -> None:
    tools = sandbox.tools()
    assert tools.editor("create", "f.py", file_text="a = 1\nb = 2\n").ok
    assert tools.editor("str_replace", "f.py", old_str="b = 2", new_str="b = 3").ok
    assert tools.editor("view", "f.py").output == "1\ta = 1\n2\tb = 3\n3\t\n"
    bad = tools.editor("str_replace", "f.py", old_str="zzz", new_str="")
    assert bad.exit_code == 1 and bad.error
    assert tools.editor("undo_edit", "f.py").ok
    assert sandbox.get_file("f.py") == b"a = 1\nb = 2\n"


def test_tool_call_dispatch_by_name(sandbox: ServerSandbox) -> None:
    tools = sandbox.tools()
    assert tools.call("bash", {"command": "echo via-call"}).output == "via-call\n"
    assert tools.call("editor", {"command": "create", "path": "x", "file_text": "y"}).ok


def test_concurrent_tool_calls_from_threads(sandbox: ServerSandbox) -> None:
    import threading

    tools = sandbox.tools()
    results: dict[str, str] = {}

    def bash() -> None:
        results["bash"] = tools.bash("sleep 1; echo slow").output

    thread = threading.Thread(target=bash)
    thread.start()
    results["run"] = sandbox.run("echo fast").output
    thread.join()
    assert results == {"bash": "slow\n", "run": "fast\n"}


def test_attach_from_another_handle_then_close_removes_everything(sandbox: ServerSandbox, sandbox_settings) -> None:
    sandbox.tools().bash("export FROM_INIT=1")
    other = attach_sandbox(sandbox_settings, sandbox.id)
    assert other.tools().bash("echo $FROM_INIT").output == "1\n"
    record = other.record
    other.close()
    assert not Path(record.dir).exists()
    assert all(proc_start_time(p.pid) != p.start for p in record.procs)
    with pytest.raises(SandboxError):
        attach_sandbox(sandbox_settings, sandbox.id)


def test_detach_leaves_the_sandbox_running_for_the_next_handle(sandbox: ServerSandbox, sandbox_settings) -> None:
    sandbox.tools().bash("export FROM_INIT=1")
    sandbox.detach()
    other = attach_sandbox(sandbox_settings, sandbox.id)
    try:
        assert other.tools().bash("echo $FROM_INIT").output == "1\n"
    finally:
        other.detach()


def test_close_kills_background_processes(sandbox: ServerSandbox) -> None:
    tools = sandbox.tools()
    tools.bash("sleep 300 & setsid sleep 301 &")
    tree = sandbox._cgroups.pids() or [p.pid for p in sandbox.record.procs]
    assert tree
    starts = {pid: proc_start_time(pid) for pid in tree}
    sandbox.close()
    deadline = time.monotonic() + 10
    while any(proc_start_time(pid) == start and start is not None for pid, start in starts.items()):
        assert time.monotonic() < deadline, "processes survived close()"
        time.sleep(0.05)
    assert not os.path.exists(sandbox.record.dir)


def test_cpu_time_limit_stops_a_spinning_command(make_sandbox: Callable[..., ServerSandbox], driver: str) -> None:
    sandbox = make_sandbox(driver, SandboxSpec(limits=Limits(cpu_time_s=1)))
    result = sandbox.run(["bash", "-c", "while :; do :; done"], timeout_s=60)
    assert result.exit_code == 128 + 24  # SIGXCPU
    assert sandbox.tools().bash("echo alive").output == "alive\n"


def test_wall_time_caps_calls_and_the_reaper_removes_the_sandbox(
    make_sandbox: Callable[..., ServerSandbox], driver: str, sandbox_settings
) -> None:
    sandbox = make_sandbox(driver, SandboxSpec(limits=Limits(wall_time_s=6)))
    result = sandbox.tools().bash("sleep 30", timeout_s=30)
    assert result.timed_out
    assert sandbox.record.deadline is not None
    while time.time() <= sandbox.record.deadline:
        time.sleep(0.1)
    assert reap_sandboxes(sandbox_settings) == [sandbox.id]
    assert not Path(sandbox.record.dir).exists()


def test_restore_of_a_bad_snapshot_raises_and_names_it(sandbox: ServerSandbox, tmp_path: Path) -> None:
    bogus = tmp_path / "bogus.tar"
    bogus.write_bytes(b"not a tar archive")
    with pytest.raises(SandboxError, match="restore failed"):
        sandbox.restore(bogus)


def test_restored_files_belong_to_the_sandbox_user(sandbox: ServerSandbox) -> None:
    sandbox.run("mkdir -p d && echo v1 > d/f")
    snap = sandbox.snapshot()
    sandbox.restore(snap)
    assert sandbox.run("echo v2 > d/f && cat d/f").output == "v2\n"


def test_agent_killing_the_server_raises_sandbox_error_not_a_hang(sandbox: ServerSandbox) -> None:
    tools = sandbox.tools()
    with pytest.raises(SandboxError):
        tools.bash("kill -9 $PPID; sleep 5", timeout_s=10)
    with pytest.raises(SandboxError):
        tools.bash("echo again", timeout_s=5)
    sandbox.close()
    assert not Path(sandbox.record.dir).exists()


def test_worker_environment_does_not_leak_into_the_sandbox(
    make_sandbox: Callable[..., ServerSandbox], driver: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("FARM_DATABASE__URL", "postgresql://farm:hunter2@db/farm")
    sandbox = make_sandbox(driver, SandboxSpec(env={"TASK_VAR": "given"}))
    for env_dump in (sandbox.run("env").output, sandbox.tools().bash("env").output):
        assert "hunter2" not in env_dump
        assert "TASK_VAR=given" in env_dump
    assert "hunter2" not in sandbox.tools().ipython("import os; dict(os.environ)").output
