"""The worker side of the execution server: typed calls over the Unix socket.

One connection per thread (calls on one connection are serial), opened on first use, so the
agent loop's bash and an evaluator's ``run`` in another thread do not queue behind each other.
Tool failures come back as :class:`ToolResult`; only a broken server raises.
"""

from __future__ import annotations

import base64
import socket
import threading
from collections.abc import Callable, Sequence
from typing import Any

from farm.errors import SandboxError, SandboxTimeout, WireError
from farm.tools.base import ToolResult
from farm.tools.wire import connect_unix, recv_msg, send_msg

#: extra time the socket waits beyond a call's own timeout (interrupt and drain included).
CALL_MARGIN_S = 30.0
#: timeout for calls that carry none (ping, put, get, editor).
DEFAULT_RPC_TIMEOUT_S = 60.0


class ToolClient:
    """Calls tools in one sandbox. ``on_result`` may annotate results (e.g. OOM kills seen on the host)."""

    def __init__(
        self,
        *,
        socket_path: str,
        sandbox_id: str = "",
        on_result: Callable[[ToolResult], None] | None = None,
    ) -> None:
        self.socket_path = socket_path
        self.sandbox_id = sandbox_id
        self._on_result = on_result
        self._local = threading.local()
        self._conns: list[socket.socket] = []
        self._conns_lock = threading.Lock()

    def _conn(self) -> socket.socket:
        conn: socket.socket | None = getattr(self._local, "conn", None)
        if conn is None:
            try:
                conn = connect_unix(self.socket_path)
            except OSError as exc:
                raise SandboxError(
                    "cannot reach the sandbox's execution server", sandbox_id=self.sandbox_id, error=str(exc)
                ) from exc
            self._local.conn = conn
            with self._conns_lock:
                self._conns.append(conn)
        return conn

    def _drop_conn(self) -> None:
        conn = getattr(self._local, "conn", None)
        self._local.conn = None
        if conn is not None:
            conn.close()

    def request(self, op: str, args: dict[str, Any], *, timeout_s: float = DEFAULT_RPC_TIMEOUT_S) -> dict[str, Any]:
        """One raw call. Raises SandboxTimeout/SandboxError when the server fails, not the tool."""
        conn = self._conn()
        if conn.gettimeout() != timeout_s:  # a syscall saved on the hot path
            conn.settimeout(timeout_s)
        try:
            send_msg(conn, {"op": op, "args": args})
            reply = recv_msg(conn)
        except TimeoutError as exc:
            self._drop_conn()  # a late reply would be read as the answer to the next call
            raise SandboxTimeout(f"{op} got no answer in {timeout_s:g} s", sandbox_id=self.sandbox_id) from exc
        except (OSError, WireError) as exc:
            self._drop_conn()
            raise SandboxError(f"execution server failed during {op}: {exc}", sandbox_id=self.sandbox_id) from exc
        if not reply.get("ok"):
            raise SandboxError(
                f"{op} failed in the sandbox: {reply.get('kind')}: {reply.get('error')}", sandbox_id=self.sandbox_id
            )
        result: dict[str, Any] = reply["result"]
        return result

    def _tool(self, op: str, args: dict[str, Any], timeout_s: float | None) -> ToolResult:
        rpc_timeout = (timeout_s if timeout_s is not None else DEFAULT_RPC_TIMEOUT_S) + CALL_MARGIN_S
        result = ToolResult.from_dict(self.request(op, args, timeout_s=rpc_timeout))
        if self._on_result is not None:
            self._on_result(result)
        return result

    def ping(self) -> dict[str, Any]:
        return self.request("ping", {}, timeout_s=10.0)

    def bash(self, command: str, *, timeout_s: float | None = None, session: str = "default") -> ToolResult:
        return self._tool("bash", {"command": command, "timeout_s": timeout_s, "session": session}, timeout_s)

    def ipython(self, code: str, *, timeout_s: float | None = None) -> ToolResult:
        return self._tool("ipython", {"code": code, "timeout_s": timeout_s}, timeout_s)

    def editor(self, command: str, path: str, **kwargs: Any) -> ToolResult:
        return self._tool("editor", {"command": command, "path": path, **kwargs}, None)

    def exec(
        self,
        command: str | Sequence[str],
        *,
        timeout_s: float | None = None,
        cwd: str | None = None,
        env: dict[str, str] | None = None,
    ) -> ToolResult:
        """A one-shot command outside the agent's shell (its state stays as it was)."""
        cmd: str | list[str] = command if isinstance(command, str) else list(command)
        return self._tool("exec", {"command": cmd, "timeout_s": timeout_s, "cwd": cwd, "env": env}, timeout_s)

    def call(self, name: str, arguments: dict[str, Any]) -> ToolResult:
        """Dispatch a model's tool call by name (see :mod:`farm.tools.schema`); bad calls are data."""
        try:
            if name == "bash":
                return self.bash(str(arguments["command"]), timeout_s=arguments.get("timeout_s"))
            if name == "ipython":
                return self.ipython(str(arguments["code"]), timeout_s=arguments.get("timeout_s"))
            if name in ("editor", "str_replace_editor"):
                args = dict(arguments)
                return self.editor(str(args.pop("command", "")), str(args.pop("path", "")), **args)
        except (KeyError, TypeError, ValueError) as exc:
            return ToolResult(exit_code=None, error=f"bad arguments for {name}: {exc!r}")
        return ToolResult(exit_code=None, error=f"unknown tool {name!r}")

    def put_file(self, path: str, data: bytes, *, mode: int | None = None) -> None:
        self.request("put", {"path": path, "data": base64.b64encode(data).decode(), "mode": mode})

    def get_file(self, path: str) -> bytes:
        return base64.b64decode(self.request("get", {"path": path})["data"])

    def shutdown(self) -> None:
        try:
            self.request("shutdown", {}, timeout_s=5.0)
        except SandboxError:
            pass

    def close(self) -> None:
        with self._conns_lock:
            conns, self._conns = self._conns, []
        for conn in conns:
            conn.close()
        self._local = threading.local()
