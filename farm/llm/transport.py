"""A lean HTTP/1.1 transport for httpx, for the farm's calls to its LLM backends over plain http.

httpx's own transport (httpcore) costs about as much CPU per request as the rest of a proxied
call's Python: it checks every pooled connection for readability (a ``poll`` each) on every
request and runs each read through anyio's cancel scopes. This one speaks HTTP/1.1 on an
asyncio protocol with httptools' parser (uvicorn's), keeps idle connections in a LIFO list per
origin and raises the exceptions httpx raises for the same failures, so ``AsyncClient`` and its
callers see no difference. What it does not do (https, proxies, HTTP/2, request bodies that
stream) is left to httpx: ``usable`` says when it may be used.

A response whose body was not read to its end (an aborted stream) closes its connection: that
close is what aborts a generation on vLLM and the built-in backend.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections import deque
from collections.abc import AsyncIterator

import httptools
import httpx

from farm.httpenv import plain_http

#: a connection pauses reading while this much of a body waits unread (a consumer slower than the server).
READ_BUFFER_BYTES = 1 << 20


def usable(url: str) -> bool:
    """Plain http with no proxy from the environment (``farm.httpenv.plain_http``)."""
    return plain_http(httpx.URL(url))


class _Connection(asyncio.Protocol):
    """One keep-alive connection: the parser's callbacks fill in the response being read."""

    def __init__(self, origin: tuple[str, int]) -> None:
        self.origin = origin
        self.loop = asyncio.get_running_loop()
        self.transport: asyncio.Transport | None = None
        self._parser = httptools.HttpResponseParser(self)
        self.closed = False
        self.idle_since = 0.0
        self._waiter: asyncio.Future[None] | None = None
        self._paused = False
        self.reset()

    def reset(self) -> None:
        self.status = 0
        self.headers: list[tuple[bytes, bytes]] = []
        self.headers_done = False
        self.done = False
        self.keep_alive = False
        self.error: httpx.TransportError | None = None
        self.chunks: deque[bytes] = deque()
        self._buffered = 0
        self.active = False

    # asyncio.Protocol
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]  # a TCP transport (uvloop's is no asyncio.Transport)

    def data_received(self, data: bytes) -> None:
        if not self.active:  # nothing was asked: a server that talks out of turn is not reused
            self.close()
            return
        try:
            self._parser.feed_data(data)
        except httptools.HttpParserError as exc:
            self.error = httpx.RemoteProtocolError(f"the server sent malformed HTTP: {exc}")
            self.close()
        if self._buffered > READ_BUFFER_BYTES and not self._paused and self.transport is not None:
            self.transport.pause_reading()
            self._paused = True
        self._wake()

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        if self.active and not self.done and self.error is None:
            if self.headers_done and not self._framed():
                self.done = True  # a body that ends with the connection
            elif exc is not None:
                self.error = httpx.ReadError(str(exc) or type(exc).__name__)
            elif self.headers_done:
                self.error = httpx.RemoteProtocolError("peer closed connection without sending complete message body")
            else:
                self.error = httpx.RemoteProtocolError("Server disconnected without sending a response.")
        self._wake()

    # httptools callbacks
    def on_header(self, name: bytes, value: bytes) -> None:
        self.headers.append((name, value))

    def on_headers_complete(self) -> None:
        self.status = self._parser.get_status_code()
        self.keep_alive = self._parser.should_keep_alive()
        self.headers_done = True

    def on_body(self, body: bytes) -> None:
        self.chunks.append(body)
        self._buffered += len(body)

    def on_message_complete(self) -> None:
        self.done = True

    def _framed(self) -> bool:
        return any(name.lower() in (b"content-length", b"transfer-encoding") for name, _ in self.headers)

    def _wake(self) -> None:
        if self._waiter is not None and not self._waiter.done():
            self._waiter.set_result(None)

    def take(self) -> bytes:
        data = b"".join(self.chunks) if len(self.chunks) > 1 else self.chunks[0]
        self.chunks.clear()
        self._buffered = 0
        if self._paused and self.transport is not None and not self.closed:
            self.transport.resume_reading()
            self._paused = False
        return data

    async def wait(self, timeout: float | None, request: httpx.Request) -> None:
        """Until the parser has more for the reader, the connection ends, or ``timeout`` passes."""
        self._waiter = waiter = self.loop.create_future()
        timer = None if timeout is None else self.loop.call_later(timeout, _expire, waiter)
        try:
            await waiter
        except TimeoutError:
            raise httpx.ReadTimeout(f"no data from the server in {timeout} s", request=request) from None
        finally:
            self._waiter = None
            if timer is not None:
                timer.cancel()

    def close(self) -> None:
        self.closed = True
        if self.transport is not None:
            # A connection left from an event loop that has ended cannot be closed through it (its
            # socket goes with the transport).
            with contextlib.suppress(RuntimeError):
                self.transport.close()


def _expire(waiter: asyncio.Future[None]) -> None:
    if not waiter.done():
        waiter.set_exception(TimeoutError())


class _Body(httpx.AsyncByteStream):
    def __init__(self, transport: LeanTransport, conn: _Connection, request: httpx.Request, read_s: float | None):
        self._transport = transport
        self._conn = conn
        self._request = request
        self._read_s = read_s
        self._released = False

    async def __aiter__(self) -> AsyncIterator[bytes]:
        conn = self._conn
        while True:
            if conn.chunks:
                yield conn.take()
            elif conn.done:
                return
            elif conn.error is not None:
                raise _bound(conn.error, self._request)
            else:
                await conn.wait(self._read_s, self._request)

    async def aclose(self) -> None:
        if not self._released:
            self._released = True
            self._transport._release(self._conn)


class LeanTransport(httpx.AsyncBaseTransport):
    """Keep-alive connections to plain-http origins, at most ``max_connections`` in use at once.

    ``keepalive_expiry``: an idle connection older than this is closed instead of reused (a server
    closes its idle connections after its own timeout; one reused as it closes fails the request).
    """

    def __init__(self, *, max_connections: int, keepalive_expiry: float) -> None:
        self._max = max_connections
        self._expiry = keepalive_expiry
        self._idle: dict[tuple[str, int], list[_Connection]] = {}
        self._in_use = 0
        self._slot_waiters: deque[asyncio.Future[None]] = deque()
        self._closed = False

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        if self._closed:
            raise RuntimeError("the transport is closed")
        timeouts: dict[str, float | None] = request.extensions.get("timeout", {})
        body = await request.aread()
        await self._take_slot(timeouts.get("pool"), request)
        conn: _Connection | None = None
        try:
            conn = await self._connection(request, timeouts.get("connect"))
            conn.reset()
            conn.active = True
            assert conn.transport is not None
            try:
                conn.transport.write(_head(request, body) + body)
            except (OSError, RuntimeError) as exc:  # a transport that closed under us (uvloop raises)
                raise httpx.WriteError(str(exc) or type(exc).__name__, request=request) from exc
            read_s = timeouts.get("read")
            while not conn.headers_done:
                if conn.error is not None:
                    raise _bound(conn.error, request)
                await conn.wait(read_s, request)
        except BaseException:
            if conn is not None:
                conn.close()
            self._free_slot()
            raise
        return httpx.Response(
            conn.status,
            headers=conn.headers,
            stream=_Body(self, conn, request, read_s),
            extensions={"http_version": b"HTTP/1.1"},
        )

    async def _connection(self, request: httpx.Request, connect_s: float | None) -> _Connection:
        url = request.url
        origin = (url.host, url.port or 80)
        idle = self._idle.get(origin)
        loop = asyncio.get_running_loop()
        now = time.monotonic()
        while idle:
            conn = idle.pop()
            usable = not conn.closed and conn.transport is not None and not conn.transport.is_closing()
            if usable and conn.loop is loop and now - conn.idle_since < self._expiry:
                return conn
            conn.close()
        conn = _Connection(origin)
        try:
            async with asyncio.timeout(connect_s):
                await loop.create_connection(lambda: conn, origin[0], origin[1])
        except TimeoutError:
            where = f"{origin[0]}:{origin[1]}"
            raise httpx.ConnectTimeout(f"no connection to {where} in {connect_s} s", request=request) from None
        except OSError as exc:
            raise httpx.ConnectError(str(exc) or type(exc).__name__, request=request) from exc
        return conn

    def _release(self, conn: _Connection) -> None:
        """The response is closed: its connection goes back to the pool if it may be reused."""
        conn.active = False
        if conn.done and conn.keep_alive and conn.error is None and not conn.closed and not self._closed:
            conn.idle_since = time.monotonic()
            conn.chunks.clear()
            self._idle.setdefault(conn.origin, []).append(conn)
        else:
            conn.close()
        self._free_slot()

    async def _take_slot(self, pool_s: float | None, request: httpx.Request) -> None:
        if self._in_use < self._max and not self._slot_waiters:
            self._in_use += 1
            return
        waiter = asyncio.get_running_loop().create_future()
        self._slot_waiters.append(waiter)
        try:
            async with asyncio.timeout(pool_s):
                await waiter  # _free_slot hands its slot over: _in_use is unchanged
        except BaseException as exc:
            if waiter.done() and not waiter.cancelled():
                self._free_slot()  # handed a slot just as it gave up: pass it on
            elif waiter in self._slot_waiters:
                self._slot_waiters.remove(waiter)
            if isinstance(exc, TimeoutError):
                raise httpx.PoolTimeout(f"no free connection in {pool_s} s", request=request) from None
            raise

    def _free_slot(self) -> None:
        while self._slot_waiters:
            waiter = self._slot_waiters.popleft()
            if not waiter.done():
                waiter.set_result(None)
                return
        self._in_use -= 1

    async def aclose(self) -> None:
        self._closed = True
        for idle in self._idle.values():
            for conn in idle:
                conn.close()
        self._idle.clear()


def _head(request: httpx.Request, body: bytes) -> bytes:
    lines = [b"%s %s HTTP/1.1\r\n" % (request.method.encode(), request.url.raw_path)]
    for name, value in request.headers.raw:
        if name.lower() not in (b"content-length", b"transfer-encoding"):
            lines.append(b"%s: %s\r\n" % (name, value))
    if body or request.method in ("POST", "PUT", "PATCH"):
        lines.append(b"Content-Length: %d\r\n" % len(body))
    lines.append(b"\r\n")
    return b"".join(lines)


def _bound(error: httpx.TransportError, request: httpx.Request) -> httpx.TransportError:
    """The connection's error, naming the request it failed (httpx's exceptions carry it)."""
    error.request = request
    return error
