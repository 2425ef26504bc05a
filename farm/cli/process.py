"""Binding the proxy's sockets and starting its serving processes (``farm proxy``)."""

from __future__ import annotations

import socket
from pathlib import Path
from typing import Any

import click
from uvicorn.protocols.http.h11_impl import H11Protocol

from farm.cli.base import load_settings
from farm.config import Settings

#: what uvicorn's supervisor imports in each child of ``farm proxy --processes N``.
APP_FACTORY = "farm.cli.process:proxy_app_from_environment"


def bind_proxy_sockets(
    settings: Settings, *, host: str | None, port: int | None, unix_path: Path | None
) -> list[socket.socket]:
    """The proxy's TCP socket and, where one is configured, its Unix socket (bound here, before any
    serving process starts, so every one of them shares the same ones)."""
    tcp = socket.create_server((host or settings.proxy.host, port or settings.proxy.port), reuse_port=False)
    sockets = [tcp]
    path = unix_path or settings.proxy.socket
    if path is not None:
        path.unlink(missing_ok=True)
        unix = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        unix.bind(str(path))
        path.chmod(0o666)  # sandboxed harnesses run as another uid; the trial key is the access control
        sockets.append(unix)
    return sockets


class HeadersTimedOut(H11Protocol):
    """uvicorn's HTTP/1.1 protocol, closing a connection whose request's headers have not all come
    within ``headers_timeout_s`` (uvicorn has no such timeout: a client trickling its headers
    would hold its socket for ever). The body's own deadline is ``farm.proxy.bounds.read_body``'s."""

    #: set from ``proxy.read_timeout_s`` in each serving process (``serve_proxy``, ``proxy_app_from_environment``).
    headers_timeout_s = 30.0

    def connection_made(self, transport: Any) -> None:
        super().connection_made(transport)
        self._await_headers()

    def on_response_complete(self) -> None:
        super().on_response_complete()
        self._await_headers()

    def _await_headers(self) -> None:
        waiting_on = self.cycle  # a new request's headers make a new cycle
        self.loop.call_later(self.headers_timeout_s, self._headers_due, waiting_on)

    def _headers_due(self, waiting_on: Any) -> None:
        if self.cycle is waiting_on and not self.transport.is_closing():
            self.transport.close()


def headers_deadline(seconds: float) -> type[HeadersTimedOut]:
    """``HeadersTimedOut`` closing after ``seconds`` (the API process's: ``api.read_timeout_s``)."""
    return type("HeadersTimedOut", (HeadersTimedOut,), {"headers_timeout_s": seconds})


def serve_proxy(settings: Settings, sockets: list[socket.socket], *, processes: int) -> None:
    """Serve the proxy on ``sockets`` in this process, or in ``processes`` children of it."""
    import uvicorn

    from farm.proxy.app import create_proxy_app

    HeadersTimedOut.headers_timeout_s = settings.proxy.read_timeout_s
    if processes == 1:
        config = uvicorn.Config(
            create_proxy_app(sized_for_proxy(settings)),
            log_level="info",
            timeout_graceful_shutdown=5,
            http=HeadersTimedOut,
        )
        uvicorn.Server(config).run(sockets=sockets)
        return
    from uvicorn.supervisors import Multiprocess

    # One event loop serves a process's calls one slice at a time; more processes on the same sockets
    # let the kernel spread calls over cores. uvicorn's supervisor spawns them (an app by import
    # string: each child builds its own from the same environment) and replaces one that dies.
    config = uvicorn.Config(
        APP_FACTORY,
        factory=True,
        workers=processes,
        http=HeadersTimedOut,
        log_level="info",
        timeout_graceful_shutdown=5,
    )
    Multiprocess(config, sockets=sockets).run()


def proxy_app_from_environment() -> Any:
    """The proxy app of one of ``farm proxy --processes N``'s children (settings from its environment)."""
    from farm.proxy.app import create_proxy_app

    settings = load_settings()
    HeadersTimedOut.headers_timeout_s = settings.proxy.read_timeout_s
    return create_proxy_app(sized_for_proxy(settings))


def sized_for_proxy(settings: Settings) -> Settings:
    """``settings`` with the pools of a ``farm proxy`` process sized (``farm.db.budget``), said in its log."""
    from farm.db.budget import proxy_process_pools, proxy_settings

    click.echo(f"database connections of this proxy process: {proxy_process_pools(settings).describe()}", err=True)
    return proxy_settings(settings)
