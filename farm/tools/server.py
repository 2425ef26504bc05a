"""The execution server: runs inside the sandbox and holds its tool sessions for the sandbox's life.

Started by the sandbox driver as ``python -m farm.tools.server '{"socket_path": ...}'``; listens on a Unix
socket in a directory bind-mounted to the host. Speaks :mod:`farm.tools.wire`. Stdlib,
ptyprocess and (lazily) jupyter_client only, so it starts fast with the host's Python.
"""

from __future__ import annotations

import base64
import json
import os
import resource
import signal
import socket
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from farm.errors import WireError
from farm.tools.base import DEFAULT_OUTPUT_CAP_BYTES, DEFAULT_TOOL_TIMEOUT_S, ToolResult
from farm.tools.bash import BashSession
from farm.tools.editor import Editor, read_regular_file
from farm.tools.exec import run_command
from farm.tools.relay import Relays
from farm.tools.wire import bind_unix, recv_msg, send_msg

#: largest file ``get`` returns; bigger files should be read in ranges or through a snapshot.
MAX_GET_BYTES = 64 * 1024 * 1024
#: at shutdown, how long a call in flight may take to finish before its session is closed anyway.
CLOSE_WAIT_S = 15.0


class ExecServer:
    """Dispatches requests to tools. One lock per tool session: calls to a session are serial."""

    def __init__(self, config: dict[str, Any]) -> None:
        self.socket_path = str(config["socket_path"])
        self.workspace = str(config["workspace"])
        self.env: dict[str, str] = {str(k): str(v) for k, v in (config.get("env") or {}).items()}
        self.cap = int(config.get("output_cap_bytes", DEFAULT_OUTPUT_CAP_BYTES))
        self.limit: int | None = config.get("output_limit_bytes") or None
        self.timeout_s = float(config.get("tool_timeout_s", DEFAULT_TOOL_TIMEOUT_S))
        self.cpu_time_s: int | None = config.get("cpu_time_s")
        self.deadline: float | None = config.get("deadline")
        self.started = time.time()
        self._lock = threading.Lock()
        self._session_locks: dict[str, threading.Lock] = {}
        self._bash: dict[str, BashSession] = {}
        self._ipython: Any = None
        self._editor = Editor(workspace=self.workspace, output_cap_bytes=self.cap)
        self._stop = threading.Event()
        self._forwards: list[dict[str, Any]] = list(config.get("forwards") or [])
        self._relays = Relays()
        self._ops: dict[str, Callable[[dict[str, Any]], dict[str, Any]]] = {
            "ping": self._op_ping,
            "bash": self._op_bash,
            "ipython": self._op_ipython,
            "editor": self._op_editor,
            "exec": self._op_exec,
            "put": self._op_put,
            "get": self._op_get,
            "shutdown": self._op_shutdown,
        }

    def _session_lock(self, key: str) -> threading.Lock:
        with self._lock:
            return self._session_locks.setdefault(key, threading.Lock())

    def _timeout(self, args: dict[str, Any]) -> float:
        timeout = float(args.get("timeout_s") or self.timeout_s)
        if self.deadline is not None:  # a call never outlives the sandbox's wall-time budget
            timeout = max(min(timeout, self.deadline - time.time()), 0.0)
        return timeout

    def _op_ping(self, args: dict[str, Any]) -> dict[str, Any]:
        return {"pid": os.getpid(), "uptime_s": time.time() - self.started}

    def _op_bash(self, args: dict[str, Any]) -> dict[str, Any]:
        name = str(args.get("session") or "default")
        with self._session_lock(f"bash:{name}"):
            if name not in self._bash:
                self._bash[name] = BashSession(
                    cwd=self.workspace,
                    env=self.env,
                    output_cap_bytes=self.cap,
                    output_limit_bytes=self.limit,
                    cpu_time_s=self.cpu_time_s,
                )
            return self._bash[name].run(str(args["command"]), timeout_s=self._timeout(args)).to_dict()

    def _op_ipython(self, args: dict[str, Any]) -> dict[str, Any]:
        with self._session_lock("ipython"):
            if self._ipython is None:
                from farm.tools.ipython import IPythonSession

                self._ipython = IPythonSession(
                    cwd=self.workspace, env=self.env, output_cap_bytes=self.cap, output_limit_bytes=self.limit
                )
            result: ToolResult = self._ipython.run(str(args["code"]), timeout_s=self._timeout(args))
            return result.to_dict()

    def _op_editor(self, args: dict[str, Any]) -> dict[str, Any]:
        with self._session_lock("editor"):
            kwargs = {k: args.get(k) for k in ("file_text", "old_str", "new_str", "insert_line", "view_range")}
            return self._editor.run(str(args.get("command")), str(args.get("path") or ""), **kwargs).to_dict()

    def _op_exec(self, args: dict[str, Any]) -> dict[str, Any]:
        env = {**self.env, **{str(k): str(v) for k, v in (args.get("env") or {}).items()}}
        return run_command(
            args["command"],
            cwd=str(args.get("cwd") or self.workspace),
            env=env,
            timeout_s=self._timeout(args),
            output_cap_bytes=int(args.get("output_cap_bytes") or self.cap),
            output_limit_bytes=self.limit,
            cpu_time_s=self.cpu_time_s,
        ).to_dict()

    def _path(self, args: dict[str, Any]) -> Path:
        p = Path(str(args["path"]))
        return p if p.is_absolute() else Path(self.workspace) / p

    def _op_put(self, args: dict[str, Any]) -> dict[str, Any]:
        path = self._path(args)
        path.parent.mkdir(parents=True, exist_ok=True)
        data = base64.b64decode(args["data"])
        path.write_bytes(data)
        if args.get("mode") is not None:
            path.chmod(int(args["mode"]))
        return {"path": str(path), "bytes": len(data)}

    def _op_get(self, args: dict[str, Any]) -> dict[str, Any]:
        path = self._path(args)
        data = read_regular_file(path, max_bytes=MAX_GET_BYTES)
        return {"path": str(path), "data": base64.b64encode(data).decode()}

    def _op_shutdown(self, args: dict[str, Any]) -> dict[str, Any]:
        self._stop.set()
        return {}

    def handle(self, request: dict[str, Any]) -> dict[str, Any]:
        op = self._ops.get(str(request.get("op")))
        if op is None:
            return {"ok": False, "kind": "ValueError", "error": f"unknown op {request.get('op')!r}"}
        try:
            return {"ok": True, "result": op(dict(request.get("args") or {}))}
        except Exception as exc:  # noqa: BLE001 - every failure goes back to the caller as data
            return {"ok": False, "kind": type(exc).__name__, "error": str(exc)}

    def _serve_conn(self, conn: socket.socket) -> None:
        with conn:
            while not self._stop.is_set():
                try:
                    request = recv_msg(conn)
                except (WireError, OSError, ValueError):
                    return
                send_msg(conn, self.handle(request))

    def close(self) -> None:
        # A call in flight (e.g. interrupting a command cut short by the wall time) finishes first:
        # closing a session under it would turn its answer into a crash.
        sessions: list[tuple[str, Any]] = [(f"bash:{name}", s) for name, s in self._bash.items()]
        if self._ipython is not None:
            sessions.append(("ipython", self._ipython))
        for key, session in sessions:
            lock = self._session_lock(key)
            got = lock.acquire(timeout=CLOSE_WAIT_S)
            try:
                session.close()
            finally:
                if got:
                    lock.release()

    def serve(self) -> None:
        Path(self.socket_path).unlink(missing_ok=True)
        listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        bind_unix(listener, self.socket_path)
        listener.listen(64)
        listener.settimeout(0.5)
        # The first bash starts now, so its start-up cost is paid at sandbox creation.
        self._op_bash({"command": "true"})
        self._relays.start(self._forwards)
        Path(self.socket_path + ".ready").write_text(str(os.getpid()))
        try:
            while not self._stop.is_set():
                if self.deadline is not None and time.time() > self.deadline:
                    break
                try:
                    conn, _ = listener.accept()
                except TimeoutError:
                    continue
                conn.settimeout(None)
                try:
                    threading.Thread(target=self._serve_conn, args=(conn,), daemon=True).start()
                except RuntimeError:  # no thread left under the pids limit (a fork bomb): refuse, live on
                    conn.close()
        finally:
            self._stop.set()
            listener.close()
            self._relays.stop()
            self.close()


def main(argv: list[str] | None = None) -> None:
    argv = sys.argv[1:] if argv is None else argv
    # The config comes inline (small, and no file in the sandbox the agent could rewrite).
    config = json.loads(argv[0])
    if config.get("fsize_bytes"):
        # The disk quota's fallback: no file a sandbox process writes grows past it (EFBIG).
        limit = int(config["fsize_bytes"])
        resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit))
    server = ExecServer(config)
    signal.signal(signal.SIGTERM, lambda *_: server._stop.set())
    server.serve()


if __name__ == "__main__":
    main()
