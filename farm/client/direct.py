"""Results pages over ``http.client``: a binary page's body is read straight into its NumPy buffer.

httpx hands a body over in chunks of 64 KB, each a new bytes object then copied into the page's
buffer; a page runs to megabytes, and reading it so took about half of the client's CPU per page. Here the socket
reads into the buffer itself (``readinto``). Only the transfer differs: the request is the one the
client's httpx settings build (URL, headers, token, timeouts), and every other answer (an error,
a JSON page) becomes an ``httpx.Response`` read by the same code as httpx's. Failures raise what
httpx raises for them, with its messages (``httpx.ConnectError``, ``ReadError``,
``RemoteProtocolError``...). A client with its own transport, a proxy from the environment or an
https URL keeps httpx for everything (``DirectPages.usable``).
"""

from __future__ import annotations

import functools
import http.client
import socket
import threading
from collections.abc import Callable, Iterator
from typing import TypeVar

import httpx
import numpy as np
import numpy.typing as npt

from farm.httpenv import plain_http

#: bytes per read of a body that is not read into a buffer (errors, JSON pages).
_READ_BYTES = 64 * 1024

T = TypeVar("T")


def _reading(request: httpx.Request, call: Callable[[], T]) -> T:
    """``call()``, with what the socket or http.client raise while reading an answer turned into
    what httpx raises for the same failure."""
    try:
        return call()
    except http.client.RemoteDisconnected as exc:  # before the status line (a ConnectionResetError too)
        raise httpx.RemoteProtocolError("Server disconnected without sending a response.", request=request) from exc
    except http.client.IncompleteRead as exc:
        message = "peer closed connection without sending complete message body (incomplete chunked read)"
        raise httpx.RemoteProtocolError(message, request=request) from exc
    except http.client.HTTPException as exc:
        raise httpx.RemoteProtocolError(str(exc), request=request) from exc
    except TimeoutError as exc:
        raise httpx.ReadTimeout(str(exc), request=request) from exc
    except OSError as exc:
        raise httpx.ReadError(str(exc), request=request) from exc


def _truncated(request: httpx.Request, received: int, expected: int) -> httpx.RemoteProtocolError:
    return httpx.RemoteProtocolError(
        f"peer closed connection without sending complete message body (received {received} bytes, "
        f"expected {expected})",
        request=request,
    )


def _idle_open(sock: socket.socket) -> bool:
    """Whether an idle kept-alive connection is still good: the server has neither closed it nor
    sent anything unasked (httpx drops such a connection before use too)."""
    sock.setblocking(False)
    try:
        sock.recv(1, socket.MSG_PEEK)  # b"": closed; anything else: not an answer to anything
        return False
    except BlockingIOError:
        return True
    except OSError:
        return False
    finally:
        sock.setblocking(True)


class _Exchange(httpx.SyncByteStream):
    """One request's connection and answer; as a stream, the answer's body for httpx to read (and
    decode, as it does its own). Its connection goes back to the pool, or is closed, once."""

    def __init__(self, pool: DirectPages, conn: http.client.HTTPConnection, request: httpx.Request) -> None:
        self._pool, self.request = pool, request
        self._conn: http.client.HTTPConnection | None = conn
        self.answer: http.client.HTTPResponse | None = None

    def start(self) -> http.client.HTTPResponse:
        """Send the request's head (a GET has no body) and read the answer's."""
        conn, request = self._conn, self.request
        assert conn is not None
        try:
            target = request.url.raw_path.decode("ascii")
            conn.putrequest(request.method, target, skip_host=True, skip_accept_encoding=True)
            for name, value in request.headers.raw:
                conn.putheader(name, value)
            conn.endheaders()
        except TimeoutError as exc:
            raise httpx.WriteTimeout(str(exc), request=request) from exc
        except OSError as exc:
            raise httpx.WriteError(str(exc), request=request) from exc
        self.answer = _reading(request, conn.getresponse)
        return self.answer

    def __iter__(self) -> Iterator[bytes]:
        answer = self.answer
        assert answer is not None
        expected, received = answer.length, 0
        while chunk := _reading(self.request, lambda: answer.read1(_READ_BYTES)):
            received += len(chunk)
            yield chunk
        if expected is not None and received < expected:
            raise _truncated(self.request, received, expected)

    def read_into(self, view: memoryview) -> None:
        """The whole body into ``view``, its length."""
        answer = self.answer
        assert answer is not None
        filled = 0
        while filled < len(view):
            read = _reading(self.request, functools.partial(answer.readinto, view[filled:]))
            if not read:
                raise _truncated(self.request, filled, len(view))
            filled += read

    def close(self) -> None:
        conn, self._conn = self._conn, None
        if conn is None:
            return
        answer = self.answer
        # Read to its end (http.client marks a body read by length only on the next read) and
        # kept open by the server: the connection serves the next request.
        if answer is not None and (answer.isclosed() or answer.length == 0) and not answer.will_close:
            answer.close()  # its file only: the connection's socket stays open
            self._pool.put(conn)
        else:
            conn.close()


class DirectPages:
    """Sends results page requests with ``http.client``, keeping connections alive between them
    (one per page in flight: ``FarmClient.results`` reads pages ahead in threads)."""

    def __init__(self) -> None:
        self._idle: dict[tuple[str, int], list[http.client.HTTPConnection]] = {}
        self._lock = threading.Lock()
        self._closed = False

    @staticmethod
    def usable(base_url: httpx.URL, *, transport: object) -> bool:
        """Whether pages from ``base_url`` may go direct: no transport of the caller's (a test's
        MockTransport, retries, a socket path) and ``plain_http``."""
        return transport is None and plain_http(base_url)

    def send(
        self, request: httpx.Request, body_buffer: Callable[[httpx.Response], npt.NDArray[np.uint8] | None]
    ) -> tuple[httpx.Response, npt.NDArray[np.uint8] | None]:
        """Send ``request`` (a GET); returns its answer and, where ``body_buffer`` gives a buffer
        for it, that buffer with the whole body read into it. Otherwise the answer's body is read
        as httpx reads it.

        Raises:
            httpx.TransportError: the subclass httpx raises for the same failure, with its message.
        """
        exchange = _Exchange(self, self._connect(request), request)
        try:
            answer = exchange.start()
            response = httpx.Response(
                answer.status,
                headers=answer.getheaders(),
                stream=exchange,
                request=request,
                extensions={"http_version": b"HTTP/1.1", "reason_phrase": answer.reason.encode("latin-1")},
            )
            buffer = body_buffer(response)
            if buffer is None:
                response.read()  # closes the exchange
                return response, None
            exchange.read_into(buffer.data)
            exchange.close()
            return response, buffer
        except BaseException:
            exchange.answer = None  # not read to its end: the connection is closed
            exchange.close()
            raise

    def put(self, conn: http.client.HTTPConnection) -> None:
        with self._lock:
            if not self._closed:  # else a page read ahead that ended after the client closed
                self._idle.setdefault((conn.host, conn.port), []).append(conn)
                return
        conn.close()

    def close(self) -> None:
        with self._lock:
            self._closed = True
            conns = [conn for idle in self._idle.values() for conn in idle]
            self._idle.clear()
        for conn in conns:
            conn.close()

    def _connect(self, request: httpx.Request) -> http.client.HTTPConnection:
        url = request.url
        key = (url.host, url.port or 80)
        timeouts = request.extensions.get("timeout", {})
        conn = None
        with self._lock:
            idle = self._idle.get(key, [])
            while idle and conn is None:
                conn = idle.pop()
                if conn.sock is None or not _idle_open(conn.sock):
                    conn.close()
                    conn = None
        if conn is None:
            conn = http.client.HTTPConnection(*key, timeout=timeouts.get("connect"))
            try:
                conn.connect()
            except TimeoutError as exc:
                raise httpx.ConnectTimeout(str(exc), request=request) from exc
            except OSError as exc:
                raise httpx.ConnectError(str(exc), request=request) from exc
        assert conn.sock is not None
        conn.sock.settimeout(timeouts.get("read"))
        return conn
