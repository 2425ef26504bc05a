"""A persistent bash behind a pseudo-terminal: cwd, variables and functions survive between calls.

Completion is detected with a per-call sentinel that bash prints after the command:
``printf '__FARM_%s_%s__\\n' NONCE "$?"``. The pattern matched is the *printed* form (nonce
followed by the exit code), which never appears in the command text itself, so an echoed or
``cat``-ed command line cannot be mistaken for completion. Terminal echo and readline are off,
so the output is exactly what the command wrote.
"""

from __future__ import annotations

import os
import re
import resource
import secrets
import select
import signal
import termios
import time
from collections.abc import Mapping
from typing import Any

from ptyprocess import PtyProcess

from farm.tools.base import (
    DEFAULT_OUTPUT_CAP_BYTES,
    DEFAULT_TOOL_TIMEOUT_S,
    OutputBuffer,
    ToolResult,
    output_limit_error,
)

#: after Ctrl-C, how long the command gets to die before its process group is killed.
INTERRUPT_GRACE_S = 2.0
#: after the foreground job is SIGKILLed, how long the shell gets to answer before it is replaced.
KILL_GRACE_S = 5.0
#: how long a freshly started shell may take to answer its first sentinel.
SHELL_START_TIMEOUT_S = 10.0
#: bytes held back from the output buffer while looking for a sentinel split across reads.
_HOLDBACK_BYTES = 64
_READ_BYTES = 65536
#: while a call waits, how often it checks that the shell is still alive.
_LIVENESS_POLL_S = 0.25
#: pause after Ctrl-C so the terminal's input flush cannot eat the next line.
_CTRL_C_SETTLE_S = 0.05
_SHELL_ARGV = ["/bin/bash", "--noprofile", "--norc", "--noediting", "-i"]
# History expansion would mangle '!' in commands; prompts would pollute the output.
# bash saves the terminal modes and restores them after a job dies of a signal: stty here makes
# the saved modes the ones we want (no echo, "\n" not "\r\n").
_SHELL_INIT = (
    "stty -echo -onlcr 2>/dev/null; set +H; PS1=''; PS2=''; PS0=''; unset PROMPT_COMMAND; "
    "export PAGER=cat GIT_PAGER=cat TERM=dumb"
)


class BashSession:
    """One interactive bash. Every failure comes back as a :class:`ToolResult`, never an exception."""

    def __init__(
        self,
        *,
        cwd: str,
        env: Mapping[str, str] | None = None,
        output_cap_bytes: int = DEFAULT_OUTPUT_CAP_BYTES,
        output_limit_bytes: int | None = None,
        default_timeout_s: float = DEFAULT_TOOL_TIMEOUT_S,
        cpu_time_s: int | None = None,
    ) -> None:
        self._cwd = cwd
        self._env = dict(env or {})
        self._cap = output_cap_bytes
        #: bytes a command may print before it is interrupted (as at a timeout); None: no limit.
        self._limit = output_limit_bytes
        self._default_timeout_s = default_timeout_s
        self._cpu_time_s = cpu_time_s
        self._tag = secrets.token_hex(4)
        # Any sentinel of this shell: a stale one (from an interrupted call) is dropped, not shown.
        self._sentinel_re = re.compile(rb"__FARM_(" + self._tag.encode() + rb"\d+)_(\d+)__\r?\n")
        self._calls = 0
        self._proc: PtyProcess | None = None
        self._start()

    @property
    def pid(self) -> int | None:
        return self._proc.pid if self._proc is not None else None

    def _preexec(self) -> None:
        if self._cpu_time_s is not None:
            resource.setrlimit(resource.RLIMIT_CPU, (self._cpu_time_s, self._cpu_time_s + 1))

    def _start(self) -> None:
        self._proc = PtyProcess.spawn(
            _SHELL_ARGV, cwd=self._cwd, env=self._env, echo=False, dimensions=(50, 250), preexec_fn=self._preexec
        )
        attrs = termios.tcgetattr(self._proc.fd)
        attrs[1] &= ~termios.ONLCR  # plain "\n" out, as a pipe would give
        termios.tcsetattr(self._proc.fd, termios.TCSANOW, attrs)
        nonce = self._nonce()
        self._write(_SHELL_INIT + "\n" + self._sentinel_cmd(nonce))
        buf = OutputBuffer(cap_bytes=self._cap)
        if self._wait(nonce, buf, time.monotonic() + SHELL_START_TIMEOUT_S) is None:
            raise RuntimeError(f"bash did not start: {buf.render()[0]!r}")

    def _nonce(self) -> str:
        self._calls += 1
        return f"{self._tag}{self._calls}"

    @staticmethod
    def _sentinel_cmd(nonce: str) -> str:
        return f"printf '__FARM_%s_%s__\\n' {nonce} \"$?\"\n"

    def _write(self, text: str) -> None:
        assert self._proc is not None
        os.write(self._proc.fd, text.encode())

    def _wait(self, nonce: str, buf: OutputBuffer, deadline: float) -> int | None:
        """Read into ``buf`` until the sentinel shows; its exit code, or None at the deadline
        or once ``buf`` is over its limit.

        Raises:
            EOFError: the shell exited.
        """
        assert self._proc is not None
        fd = self._proc.fd
        pattern = self._sentinel_re
        wanted = nonce.encode()
        pending = bytearray()
        while True:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                buf.write(bytes(pending))
                return None
            ready, _, _ = select.select([fd], [], [], min(remaining, _LIVENESS_POLL_S))
            if not ready:
                # A background job can hold the terminal open after the shell exited: no EOF then.
                if not self._proc.isalive():
                    buf.write(bytes(pending))
                    raise EOFError("shell exited")
                continue
            try:
                chunk = os.read(fd, _READ_BYTES)
            except OSError:  # EIO: the slave side is gone
                chunk = b""
            if not chunk:
                buf.write(bytes(pending))
                raise EOFError("shell exited")
            pending += chunk
            stale = False
            for match in pattern.finditer(pending):
                if match.group(1) == wanted:
                    buf.write(bytes(pattern.sub(b"", pending[: match.start()])))
                    return int(match.group(2))
                stale = True
            if stale:
                pending = bytearray(pattern.sub(b"", pending))
            if len(pending) > _HOLDBACK_BYTES:
                buf.write(bytes(pending[:-_HOLDBACK_BYTES]))
                del pending[:-_HOLDBACK_BYTES]
                if buf.over_limit:
                    buf.write(bytes(pending))
                    return None

    def run(self, command: str, *, timeout_s: float | None = None) -> ToolResult:
        """Run ``command`` in the shell; returns its output and exit code, or a timeout flag."""
        timeout_s = self._default_timeout_s if timeout_s is None else timeout_s
        info: dict[str, Any] = {}
        if self._proc is None:  # a death during a call is seen there (EOF or the liveness poll)
            self._restart(info)
        buf = OutputBuffer(cap_bytes=self._cap, limit_bytes=self._limit)
        nonce = self._nonce()
        try:
            self._write(command.rstrip("\n") + "\n" + self._sentinel_cmd(nonce))
            code = self._wait(nonce, buf, time.monotonic() + timeout_s)
            if code is None:
                return self._interrupt(buf, info, timeout_s)
        except (EOFError, OSError) as exc:
            self._restart(info)
            text, truncated = buf.render()
            buf.annotate(info)
            return ToolResult(
                output=text,
                exit_code=None,
                error=f"the shell exited ({exc}); a new shell was started, state was lost",
                truncated=truncated,
                info=info,
            )
        text, truncated = buf.render()
        buf.annotate(info)
        return ToolResult(output=text, exit_code=code, truncated=truncated, info=info)

    def _interrupt(self, buf: OutputBuffer, info: dict[str, Any], timeout_s: float) -> ToolResult:
        # Ctrl-C first, as a person would; the shell survives it because it is interactive.
        assert self._proc is not None
        limit_hit = buf.over_limit
        buf.limit = None  # what the interrupted command still prints is drained (and cut), not a new stop
        self._write("\x03")
        time.sleep(_CTRL_C_SETTLE_S)
        nonce = self._nonce()
        self._write(self._sentinel_cmd(nonce))
        code = self._wait(nonce, buf, time.monotonic() + INTERRUPT_GRACE_S)
        if code is None:
            # The command ignores SIGINT: kill the terminal's foreground job, never the shell.
            try:
                pgrp = os.tcgetpgrp(self._proc.fd)
                if pgrp != self._proc.pid:
                    os.killpg(pgrp, signal.SIGKILL)
            except OSError:
                pass
            nonce = self._nonce()
            self._write(self._sentinel_cmd(nonce))
            code = self._wait(nonce, buf, time.monotonic() + KILL_GRACE_S)
        if code is None:
            self._restart(info)
        text, truncated = buf.render()
        buf.annotate(info)
        if limit_hit:
            info["output_limit_hit"] = True
        return ToolResult(
            output=text,
            exit_code=None,
            timed_out=not limit_hit,
            error=output_limit_error(self._limit) if limit_hit else f"timed out after {timeout_s:g} s",
            truncated=truncated,
            info=info,
        )

    def _restart(self, info: dict[str, Any]) -> None:
        self.close()
        self._start()
        info["shell_restarted"] = True

    def close(self) -> None:
        if self._proc is None:
            return
        proc, self._proc = self._proc, None
        try:
            # The shell leads its own session: kill its background jobs' groups with it.
            os.killpg(proc.pid, signal.SIGKILL)
        except OSError:
            pass
        try:
            proc.close(force=True)
        except Exception:  # noqa: BLE001 - best effort: the process is gone either way
            pass
