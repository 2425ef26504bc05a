"""One-shot commands (``Sandbox.run``): not in the agent's shell, so its state is untouched.

The command gets its own session and process group. When it exits, or its time is up,
the whole group is killed: an evaluation command cannot leave a server running behind,
and a background child holding the pipe open cannot hang the call.
"""

from __future__ import annotations

import os
import resource
import select
import signal
import subprocess
import time
from collections.abc import Mapping, Sequence

from farm.tools.base import OutputBuffer, ToolResult, output_limit_error

_READ_BYTES = 65536
#: after the command's group is killed, how long what is left in the pipe is read (a process that
#: left the group with setsid may still hold the pipe and write without end).
_DRAIN_S = 0.5


def _killpg(pid: int) -> None:
    try:
        os.killpg(pid, signal.SIGKILL)
    except OSError:
        pass


def run_command(
    command: str | Sequence[str],
    *,
    cwd: str,
    env: Mapping[str, str],
    timeout_s: float,
    output_cap_bytes: int,
    output_limit_bytes: int | None = None,
    cpu_time_s: int | None = None,
) -> ToolResult:
    """Runs ``command`` (a string goes to ``bash -c``) with stdout and stderr merged.

    Past ``output_limit_bytes`` of output the command's group is killed and the result says so.
    """
    argv = ["/bin/bash", "-c", command] if isinstance(command, str) else [str(a) for a in command]

    def limit() -> None:
        if cpu_time_s is not None:
            resource.setrlimit(resource.RLIMIT_CPU, (cpu_time_s, cpu_time_s + 1))  # SIGXCPU, then SIGKILL

    buf = OutputBuffer(cap_bytes=output_cap_bytes, limit_bytes=output_limit_bytes)
    try:
        proc = subprocess.Popen(
            argv,
            cwd=cwd,
            env=dict(env),
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            preexec_fn=limit if cpu_time_s is not None else None,  # noqa: PLW1509 - fork-time rlimit only
        )
    except OSError as exc:
        return ToolResult(exit_code=None, error=f"could not start {argv[0]}: {exc}")
    assert proc.stdout is not None
    fd = proc.stdout.fileno()
    os.set_blocking(fd, False)
    deadline = time.monotonic() + timeout_s
    timed_out = limit_hit = False
    try:
        while True:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                timed_out = True
                break
            ready, _, _ = select.select([fd], [], [], min(remaining, 0.1))
            if ready:
                try:
                    chunk = os.read(fd, _READ_BYTES)
                except BlockingIOError:
                    chunk = None
                if chunk == b"":
                    # EOF can come before the exit (coreutils close stdout at exit): let it finish.
                    try:
                        proc.wait(timeout=max(deadline - time.monotonic(), 0))
                    except subprocess.TimeoutExpired:
                        timed_out = True
                    break
                if chunk:
                    buf.write(chunk)
                    if buf.over_limit:
                        limit_hit = True
                        break
                    if proc.poll() is not None:
                        break  # exited: a child that left its group may keep the pipe full forever
            elif proc.poll() is not None:
                break  # exited; a background child may still hold the pipe
    finally:
        _killpg(proc.pid)
        drain_until = time.monotonic() + _DRAIN_S
        try:
            while time.monotonic() < drain_until and (chunk := os.read(fd, _READ_BYTES)):
                buf.write(chunk)
        except (BlockingIOError, OSError):
            pass
        proc.stdout.close()
        code = proc.wait()
    text, truncated = buf.render()
    info: dict[str, object] = {}
    buf.annotate(info)
    if limit_hit:
        info["output_limit_hit"] = True
        error = output_limit_error(output_limit_bytes)
        return ToolResult(output=text, exit_code=None, error=error, truncated=truncated, info=info)
    if timed_out:
        return ToolResult(
            output=text,
            exit_code=None,
            timed_out=True,
            error=f"timed out after {timeout_s:g} s",
            truncated=truncated,
            info=info,
        )
    # A signal death is reported as a shell would: 128 + signal number.
    return ToolResult(output=text, exit_code=code if code >= 0 else 128 - code, truncated=truncated, info=info)
