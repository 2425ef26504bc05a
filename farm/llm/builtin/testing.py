"""Run a built-in backend as a real subprocess: for tests, benchmarks and ``farm up``.

``BuiltinServer`` can be stopped and started again on the same port, which is how health ejection
and re-admission are tested with a backend that is really gone. ``script=`` serves scripted replies
(``farm.llm.builtin.script``): a path to a script file, or its content as a dict.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from types import TracebackType
from typing import Any

import httpx

#: a cold start loads torch and the model: a few seconds on two shared cores.
DEFAULT_START_TIMEOUT_S = 90.0
STOP_TIMEOUT_S = 10.0


def free_port(host: str = "127.0.0.1") -> int:
    with socket.socket() as sock:
        sock.bind((host, 0))
        return int(sock.getsockname()[1])


class BuiltinServer:
    """``python -m farm.llm.builtin.cli serve`` in a subprocess; ``start`` waits until ``/health`` answers."""

    def __init__(
        self,
        *,
        model_dir: Path,
        port: int | None = None,
        host: str = "127.0.0.1",
        model_name: str = "farm-tiny",
        threads: int | None = 1,
        log_path: Path | None = None,
        script: Path | dict[str, Any] | None = None,
        step_time_ms: float = 0.0,
    ) -> None:
        from farm.llm.builtin.script import load_script

        if script is not None:
            load_script(script)  # a bad script raises ConfigError here, not as a child that will not start
        self.script = script
        self._script_file: Path | None = None
        self.model_dir = model_dir
        self.host = host
        self.port = port or free_port(host)
        self.model_name = model_name
        self.threads = threads
        self.log_path = log_path
        self.step_time_ms = step_time_ms
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    def start(self, *, timeout_s: float = DEFAULT_START_TIMEOUT_S) -> BuiltinServer:
        """Start the server and wait for it.

        Raises:
            RuntimeError: it exited or did not answer in time (its log is in the message).
        """
        cmd = [sys.executable, "-m", "farm.llm.builtin.cli", "serve", str(self.model_dir), "--host", self.host]
        cmd += ["--port", str(self.port), "--model-name", self.model_name]
        if self.threads:
            cmd += ["--threads", str(self.threads)]
        if self.step_time_ms:
            cmd += ["--step-time-ms", str(self.step_time_ms)]
        if isinstance(self.script, dict):
            if self._script_file is None:
                fd, name = tempfile.mkstemp(prefix="farm-script-", suffix=".json")
                with os.fdopen(fd, "w", encoding="utf-8") as out:
                    json.dump(self.script, out)
                self._script_file = Path(name)
            cmd += ["--script", str(self._script_file)]
        elif self.script is not None:
            # Resolved: the child runs from the repository root, not from the caller's directory.
            cmd += ["--script", str(Path(self.script).resolve())]
        # Run from the tree this module is in, so a checkout's farm wins over an installed one.
        root = str(Path(__file__).resolve().parents[3])
        env = {**os.environ, "PYTHONPATH": os.pathsep.join([root, os.environ.get("PYTHONPATH", "")])}
        if self.log_path:
            with open(self.log_path, "ab") as log:  # the child keeps its own copy of the descriptor
                self.proc = subprocess.Popen(cmd, stdout=log, stderr=log, env=env, cwd=root)
        else:
            self.proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env, cwd=root)
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                self.stop()  # removes the script's temporary file
                raise RuntimeError(f"built-in backend exited with {self.proc.returncode}: {self._log_tail()}")
            try:
                if httpx.get(f"{self.url}/health", timeout=1.0).status_code == 200:
                    return self
            except httpx.HTTPError:
                pass
            time.sleep(0.1)
        self.stop()
        raise RuntimeError(f"built-in backend did not answer within {timeout_s} s: {self._log_tail()}")

    def stop(self) -> None:
        if self._script_file is not None:
            self._script_file.unlink(missing_ok=True)
            self._script_file = None
        if self.proc is None or self.proc.poll() is not None:
            return
        self.proc.terminate()
        try:
            self.proc.wait(STOP_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()

    def _log_tail(self) -> str:
        if self.log_path and self.log_path.exists():
            return self.log_path.read_text(errors="replace")[-2000:]
        return "(no log: pass log_path)"

    def __enter__(self) -> BuiltinServer:
        return self.start()

    def __exit__(self, *_: type[BaseException] | BaseException | TracebackType | None) -> None:
        self.stop()
