"""Disk quota and output limits, tried for real from inside every driver that runs here.

Figures (bytes before ENOSPC, the server's RSS around a flood, seconds) are printed: run with
``-s`` to see them. Nothing here asserts a duration.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import textwrap
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from farm.config import Settings
from farm.sandbox import SandboxSpec, reap_sandboxes
from farm.sandbox.base import Limits
from farm.sandbox.disk import IMAGE_FILE
from farm.sandbox.server_sandbox import ServerSandbox
from tests.integration.sandbox.conftest import IMAGE_DRIVER, RUNNABLE_DRIVERS, sandbox_owner

IN_CI = bool(os.environ.get("CI"))
MIB = 1024 * 1024
QUOTA_MB = 64

#: writes 1 MiB blocks to each path in turn (the last until the disk refuses); prints what it got.
_FILL = textwrap.dedent(
    """
    import errno, json, os, sys
    budgets = [int(b) * 1024 * 1024 for b in sys.argv[1].split(",")]
    written, error, block = {}, None, b"\\1" * (1024 * 1024)
    for path, budget in zip(sys.argv[2:], budgets):
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        written[path] = 0
        try:
            while written[path] < budget:
                written[path] += os.write(fd, block)
            os.fsync(fd)
        except OSError as exc:
            error = errno.errorcode[exc.errno]
        finally:
            os.close(fd)
    print(json.dumps({"written": written, "error": error}))
    """
)


def _mounted(path: Path) -> bool:
    return any(line.split()[4] == str(path) for line in Path("/proc/self/mountinfo").read_text().splitlines())


def _loop_backing_files() -> set[str]:
    out = set()
    for f in Path("/sys/block").glob("loop*/loop/backing_file"):
        try:
            out.add(f.read_text().strip().removesuffix(" (deleted)"))
        except OSError:
            pass
    return out


def _allocated(path: Path) -> int:
    return os.stat(path).st_blocks * 512


def _host_usage_outside_fs(sdir: Path) -> int:
    """Bytes the sandbox dir holds on the host besides the image (the mounted fs not walked)."""
    total = 0
    for root, dirs, files in os.walk(sdir):
        dirs[:] = [d for d in dirs if not os.path.ismount(os.path.join(root, d))]
        total += sum(os.lstat(os.path.join(root, f)).st_blocks * 512 for f in files if f != IMAGE_FILE)
    return total


def _need_loop_quota(sandbox: ServerSandbox) -> None:
    if sandbox.record.disk_quota != "loop":
        message = "no loop-mounted disk quota here (needs root and loop devices)"
        if IN_CI:
            pytest.fail(message)
        pytest.skip(message)


@pytest.fixture(params=[d for d in RUNNABLE_DRIVERS if d != IMAGE_DRIVER])
def driver(request: pytest.FixtureRequest) -> str:
    """The drivers whose sandboxes run Python and IPython, which these checks drive inside: an image
    without Python has neither (its limits: the contract suite's ``bwrap-image`` cases and
    test_image_sandbox.py)."""
    return str(request.param)


@pytest.fixture
def quota_sandbox(make_sandbox: Callable[..., ServerSandbox], driver: str) -> ServerSandbox:
    sandbox = make_sandbox(driver, SandboxSpec(limits=Limits(disk_mb=QUOTA_MB)))
    _need_loop_quota(sandbox)
    return sandbox


def test_disk_quota_full_disk_is_enospc_inside_and_freed_on_close(quota_sandbox: ServerSandbox) -> None:
    sandbox, tools = quota_sandbox, quota_sandbox.tools()
    sdir, image = Path(sandbox.record.dir), Path(sandbox.record.dir) / IMAGE_FILE
    assert tools.ipython("started = True").ok  # started before the disk fills: it must keep answering
    tmp_file = "/tmp/fill" if sandbox.isolated else str(sandbox.fs / "tmp" / "fill")
    # When a process inside writes 16 MiB to /tmp, then to the workspace until the disk refuses,
    fill = sandbox.run(["python3", "-c", _FILL, f"16,{4 * QUOTA_MB}", tmp_file, "big.bin"], timeout_s=120)
    seen = json.loads(fill.output)
    written = sum(seen["written"].values())
    print(f"\n[{sandbox.driver}] quota {QUOTA_MB} MiB: {written / MIB:.1f} MiB written before {seen['error']}")
    print(f"[{sandbox.driver}] image holds {_allocated(image) / MIB:.1f} MiB on the host")
    # Then it gets ENOSPC once /tmp and the workspace together reach the quota,
    assert seen["error"] == "ENOSPC"
    assert seen["written"][tmp_file] == 16 * MIB
    assert 0.75 * QUOTA_MB * MIB < written <= QUOTA_MB * MIB
    # the host holds no more than the image (sparse, at most the quota) and a few small files,
    assert _allocated(image) <= QUOTA_MB * MIB
    assert _host_usage_outside_fs(sdir) < MIB
    # the sandbox still answers and can free the space,
    assert tools.bash("echo alive").output == "alive\n"
    assert tools.ipython("started").output == "True\n"
    assert tools.editor("view", ".").output == "big.bin\n"
    assert tools.bash(f"rm big.bin {tmp_file} && echo removed").output == "removed\n"
    again = sandbox.run(["python3", "-c", _FILL, "32", "again.bin"], timeout_s=120)
    assert json.loads(again.output)["error"] is None
    # and close leaves no mount, no loop device and no file behind.
    sandbox.close()
    assert not _mounted(sandbox.fs)
    assert str(image) not in _loop_backing_files()
    assert not sdir.exists()


def test_disk_quota_workspace_larger_than_the_quota_refuses_to_start(
    make_sandbox: Callable[..., ServerSandbox], driver: str, tmp_path: Path, sandbox_settings: Settings
) -> None:
    from farm.errors import SandboxUnavailable

    if os.geteuid() != 0:
        pytest.skip("no loop-mounted disk quota without root")
    seed = tmp_path / "seed"
    seed.mkdir()
    (seed / "data.bin").write_bytes(os.urandom(12 * MIB))
    root = Path(str(sandbox_settings.sandbox.root_dir))
    with pytest.raises(SandboxUnavailable, match="does not fit the disk quota"):
        make_sandbox(driver, SandboxSpec(workspace=seed, limits=Limits(disk_mb=8)))
    assert [p.name for p in root.iterdir()] == ["registry"]
    assert not any(str(root) in line for line in Path("/proc/self/mountinfo").read_text().splitlines())


def test_disk_quota_rlimit_fallback_caps_each_file(
    driver: str, sandbox_settings: Settings, make_sandbox: Callable[..., ServerSandbox]
) -> None:
    sandbox_settings.sandbox.disk_quota = "rlimit"
    sandbox = make_sandbox(driver, SandboxSpec(limits=Limits(disk_mb=8)))
    assert sandbox.record.disk_quota == "rlimit" and not _mounted(sandbox.fs)
    fill = sandbox.run(["python3", "-c", _FILL, "32", "big.bin"], timeout_s=60)
    seen = json.loads(fill.output)
    assert seen["error"] == "EFBIG" and seen["written"]["big.bin"] == 8 * MIB
    assert sandbox.tools().bash("rm big.bin && echo ok").output == "ok\n"


_OWNER_SCRIPT = """
import json, sys
from pathlib import Path
from farm.config import Settings
from farm.sandbox import SandboxSpec, create_sandbox
from farm.sandbox.base import Limits
settings = Settings(data_dir=Path(sys.argv[1]), sandbox={"root_dir": sys.argv[2]})
sandbox = create_sandbox(settings, SandboxSpec(limits=Limits(disk_mb=64)), driver="bwrap")
sandbox.run("head -c 20000000 /dev/zero > /workspace/held.bin; sleep 1000 & cd /tmp && setsid sleep 1001 &")
print(json.dumps({"id": sandbox.id, "dir": sandbox.record.dir, "quota": sandbox.record.disk_quota}), flush=True)
sys.stdin.read()
"""


@pytest.mark.usefixtures("need_bwrap")
def test_disk_quota_mount_goes_when_the_owner_is_killed_and_reaped(sandbox_settings: Settings) -> None:
    # Given a worker holding a sandbox with a mounted quota, files in it and processes whose cwd is on it,
    with sandbox_owner(_OWNER_SCRIPT, sandbox_settings) as worker:
        info = json.loads(worker.stdout.readline() if worker.stdout else "")
        # When the worker is SIGKILLed,
        worker.send_signal(signal.SIGKILL)
        worker.wait(timeout=10)
    sdir = Path(info["dir"])
    if info["quota"] != "loop":
        pytest.skip("no loop-mounted disk quota here (needs root and loop devices)")
    image = str(sdir / IMAGE_FILE)
    # the file system is still mounted (nothing else would clean it up);
    assert _mounted(sdir / "fs") and image in _loop_backing_files()
    # Then the reaper unmounts it, frees its loop device and removes the files.
    assert reap_sandboxes(sandbox_settings) == [info["id"]]
    assert not _mounted(sdir / "fs")
    assert image not in _loop_backing_files()
    assert not sdir.exists()


# ---- output ---------------------------------------------------------------------------------


def _server_pid(sandbox: ServerSandbox) -> int:
    """The execution server's pid on the host (inside bwrap it is pid 2 of its own namespace)."""
    candidates = set(sandbox._cgroups.pids())
    roots = {p.pid for p in sandbox.record.procs}
    if sandbox.driver == "docker":  # the container's processes are the engine's children, not the client's
        docker = [
            sandbox.settings.docker_path,
            *(["-H", sandbox.settings.docker_host] if sandbox.settings.docker_host else []),
        ]
        inspect = [*docker, "inspect", "--format", "{{.State.Pid}}", f"farm-{sandbox.id}"]
        roots.add(int(subprocess.run(inspect, capture_output=True, text=True, check=True, timeout=30).stdout))
    for _ in range(3):  # without cgroups: the recorded process and its descendants
        for stat in Path("/proc").glob("[0-9]*/stat"):
            try:
                fields = stat.read_text().rsplit(")", 1)[1].split()
            except (OSError, IndexError):
                continue
            if int(fields[1]) in roots | candidates:
                candidates.add(int(stat.parent.name))
        candidates |= roots
    for pid in sorted(candidates):
        try:
            cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
        except OSError:
            continue
        argv = cmdline.split(b"\0")
        # bwrap's and the cgroup wrapper's command lines carry the server's too: match the Python itself.
        if os.path.basename(argv[0]).startswith(b"python") and b"farm.tools.server" in argv:
            return pid
    raise AssertionError("execution server not found")


def _memory_kb(pid: int) -> dict[str, int]:
    out = {}
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        key, _, value = line.partition(":")
        if key in ("VmRSS", "VmHWM"):
            out[key] = int(value.split()[0])
    return out


#: what a flood may add to the server's peak RSS: buffers are KBs; 518 MB were seen before the cut.
RSS_GROWTH_BOUND_KB = 48 * 1024
#: each flood of the unlimited-output test: five times the bound.
FLOOD_BYTES = 250_000_000


def test_output_flood_is_stopped_at_the_limit_with_a_capped_reply(
    make_sandbox: Callable[..., ServerSandbox], driver: str
) -> None:
    # Given the default output limit (64 MiB) and a warmed-up server,
    sandbox = make_sandbox(driver, SandboxSpec(tool_timeout_s=120))
    tools = sandbox.tools()
    assert tools.ipython("kept = 41").ok
    pid = _server_pid(sandbox)
    before = _memory_kb(pid)
    floods = {
        "bash yes": lambda: tools.bash("yes"),
        "bash urandom|base64": lambda: tools.bash("cat /dev/urandom | base64"),
        "ipython print loop": lambda: tools.ipython("while True: print('x' * 999)"),
        "ipython os.system": lambda: tools.ipython("import os; os.system('yes')"),
        "exec yes": lambda: sandbox.run("yes"),
    }
    for name, flood in floods.items():
        # When a command prints without end,
        start = time.monotonic()
        result = flood()
        seconds = time.monotonic() - start
        after = _memory_kb(pid)
        print(
            f"\n[{driver}] {name}: {seconds:.2f} s, {result.info.get('output_bytes', 0) / MIB:.0f} MiB printed, "
            f"reply {len(result.output)} chars; server RSS {before['VmRSS']} kB -> peak {after['VmHWM']} kB"
        )
        # Then it is stopped past the limit, not at the timeout, and the reply keeps head and tail,
        assert result.info.get("output_limit_hit") is True and not result.timed_out, (name, result.error)
        assert result.truncated and len(result.output) < 17 * 1024
        assert result.info["output_bytes"] > 64 * MIB and "bytes of output omitted" in result.output
        # the server's memory stays where it was,
        assert after["VmHWM"] - before["VmHWM"] < RSS_GROWTH_BOUND_KB, (name, before, after)
    # and every session still answers with its state.
    assert tools.bash("echo alive").output == "alive\n"
    assert tools.ipython("kept + 1").output == "42\n"


@pytest.mark.slow
def test_unlimited_output_is_drained_with_bounded_memory(
    make_sandbox: Callable[..., ServerSandbox], driver: str
) -> None:
    # Given no output limit: the server drains everything and keeps only head and tail. Each flood is
    # 250 MB, five times the bound: a server that kept it would be far past the bound (a GB each took
    # a minute per driver and proved no more),
    sandbox = make_sandbox(driver, SandboxSpec(tool_timeout_s=300, output_limit_bytes=1 << 40))
    tools = sandbox.tools()
    assert tools.ipython("kept = 41").ok
    pid = _server_pid(sandbox)
    before = _memory_kb(pid)
    floods = {
        "exec 250 MB": (lambda: sandbox.run(f"head -c {FLOOD_BYTES} /dev/zero | tr '\\0' x"), FLOOD_BYTES),
        "bash 250 MB": (lambda: tools.bash(f"head -c {FLOOD_BYTES} /dev/zero | tr '\\0' y"), FLOOD_BYTES),
        "ipython 250 MB": (
            lambda: tools.ipython(
                f"import sys\nfor _ in range({FLOOD_BYTES // 1_000_000}): sys.stdout.write('z' * 999_999 + '\\n')"
            ),
            FLOOD_BYTES,
        ),
    }
    for name, (flood, size) in floods.items():
        start = time.monotonic()
        result = flood()
        seconds = time.monotonic() - start
        after = _memory_kb(pid)
        print(
            f"\n[{driver}] {name}: {seconds:.2f} s, reply {len(result.output)} chars; "
            f"server RSS {before['VmRSS']} kB -> peak {after['VmHWM']} kB"
        )
        assert result.exit_code == 0 and not result.timed_out, (name, result.error)
        assert result.truncated and result.info["output_bytes"] == size
        assert f"[... {size - 16 * 1024} bytes of output omitted ...]" in result.output
        assert after["VmHWM"] - before["VmHWM"] < RSS_GROWTH_BOUND_KB, (name, before, after)
    assert tools.ipython("kept + 1").output == "42\n"


def test_get_file_refuses_devices_and_fifos(sandbox: ServerSandbox) -> None:
    from farm.errors import SandboxError

    sandbox.run("ln -s /dev/zero zero && mkfifo fifo")
    for name in ("zero", "fifo"):
        with pytest.raises(SandboxError, match="not a regular file"):
            sandbox.get_file(name)
    assert sandbox.tools().bash("echo alive").output == "alive\n"


def test_disk_quota_busy_on_the_host_is_detached_and_freed_when_released(quota_sandbox: ServerSandbox) -> None:
    # Given a host process (here: this test) holding a file open on the sandbox's file system,
    sandbox = quota_sandbox
    image = str(Path(sandbox.record.dir) / IMAGE_FILE)
    held = open(sandbox.host_workspace / "held.txt", "w")  # noqa: SIM115 - held across close() on purpose
    try:
        # When the sandbox is closed, the mount is detached anyway and the files go,
        sandbox.close()
        assert not _mounted(sandbox.fs)
        assert not Path(sandbox.record.dir).exists()
    finally:
        held.close()
    # and the loop device goes with the last reference.
    deadline = time.monotonic() + 10
    while image in _loop_backing_files():
        assert time.monotonic() < deadline, "the loop device outlived the last open file"
        time.sleep(0.05)
