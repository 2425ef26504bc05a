"""The lean HTTP/1.1 transport against a scripted server on a local socket: keep-alive reuse, the
connections it must not reuse, and the httpx exceptions each failure raises."""

from __future__ import annotations

import asyncio
import contextlib
import socket
from collections.abc import AsyncIterator, Awaitable, Callable

import httpx
import pytest

from farm.llm.transport import LeanTransport, usable

Handler = Callable[[asyncio.StreamReader, asyncio.StreamWriter], Awaitable[None]]


def ok(body: bytes = b'{"ok": true}') -> bytes:
    return b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: %d\r\n\r\n%s" % (len(body), body)


async def read_request(reader: asyncio.StreamReader) -> tuple[bytes, bytes]:
    head = await reader.readuntil(b"\r\n\r\n")
    length = 0
    for line in head.split(b"\r\n"):
        if line.lower().startswith(b"content-length:"):
            length = int(line.split(b":")[1])
    return head, await reader.readexactly(length)


class Server:
    """Counts connections; ``handler`` serves each one."""

    def __init__(self, handler: Handler) -> None:
        self.handler = handler
        self.connections = 0
        self.closed = asyncio.Event()

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        try:
            await self.handler(reader, writer)
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        finally:
            self.closed.set()
            writer.close()


@contextlib.asynccontextmanager
async def serving(handler: Handler) -> AsyncIterator[tuple[Server, httpx.AsyncClient]]:
    server = Server(handler)
    listener = await asyncio.start_server(server._serve, "127.0.0.1", 0)
    port = listener.sockets[0].getsockname()[1]
    transport = LeanTransport(max_connections=2, keepalive_expiry=3.0)
    async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}", transport=transport, timeout=2.0) as client:
        try:
            yield server, client
        finally:
            listener.close()


async def keep_alive(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    while True:
        _, body = await read_request(reader)
        writer.write(ok(b'{"echo": %s}' % (body or b"null")))
        await writer.drain()


def test_a_connection_is_reused_and_the_body_and_headers_arrive_whole() -> None:
    async def scenario() -> None:
        async with serving(keep_alive) as (server, client):
            for i in range(3):
                resp = await client.post("/v1/x?y=1", json={"i": i})
                assert resp.status_code == 200
                assert resp.json() == {"echo": {"i": i}}
                assert resp.headers["content-type"] == "application/json"
            assert server.connections == 1

    asyncio.run(scenario())


async def endless(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    """A stream as a generation's: an event every 5 ms, for longer than any test reads it."""
    await read_request(reader)
    writer.write(b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n")
    for i in range(1000):
        line = b"data: %d\n\n" % i
        writer.write(b"%x\r\n%s\r\n" % (len(line), line))
        await writer.drain()
        await asyncio.sleep(0.005)


async def unanswered(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    """Reads the request and answers nothing until the client closes (at most 5 s)."""
    await read_request(reader)
    await asyncio.wait_for(reader.read(1), 5)  # b"" once the client closes


def test_on_uvloop_too_a_connection_is_reused_and_an_unread_stream_closes_it() -> None:
    """The proxy and the API run on uvloop, whose transports are not asyncio's."""
    uvloop = pytest.importorskip("uvloop")

    async def scenario() -> None:
        async with serving(keep_alive) as (server, client):
            for i in range(2):
                assert (await client.post("/", json={"i": i})).json() == {"echo": {"i": i}}
            assert server.connections == 1
        async with serving(endless) as (server, client):
            async with client.stream("POST", "/", json={}) as resp:
                async for _ in resp.aiter_bytes():
                    break  # closed before its end
            await asyncio.wait_for(server.closed.wait(), 2)

    uvloop.run(scenario())


def test_a_stream_closed_before_its_end_closes_its_connection() -> None:
    """Closing a stream early is how a generation is aborted: the server must see the close."""

    async def scenario() -> None:
        async with serving(endless) as (server, client):
            async with client.stream("POST", "/s", json={}) as resp:
                lines = []
                async for line in resp.aiter_lines():
                    if line:
                        lines.append(line)
                    if len(lines) == 3:
                        break
            assert lines == ["data: 0", "data: 1", "data: 2"]
            await asyncio.wait_for(server.closed.wait(), 2)

    asyncio.run(scenario())


def test_a_chunked_stream_read_to_its_end_keeps_its_connection() -> None:
    async def chunked(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        while True:
            await read_request(reader)
            writer.write(b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n")
            for part in (b"ab", b"c\xc3", b"\xa9"):
                writer.write(b"%x\r\n%s\r\n" % (len(part), part))
                await writer.drain()
            writer.write(b"0\r\n\r\n")

    async def scenario() -> None:
        async with serving(chunked) as (server, client):
            for _ in range(2):
                resp = await client.get("/")
                assert resp.text == "abcé"
            assert server.connections == 1

    asyncio.run(scenario())


def test_an_idle_connection_past_its_expiry_is_not_reused() -> None:
    async def scenario() -> None:
        async with serving(keep_alive) as (server, client):
            await client.get("/")
            transport = client._transport
            assert isinstance(transport, LeanTransport)
            transport._expiry = 0.05
            await asyncio.sleep(0.1)
            await client.get("/")
            assert server.connections == 2

    asyncio.run(scenario())


def test_a_connection_the_server_closed_while_idle_is_not_reused() -> None:
    async def once(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await read_request(reader)
        writer.write(ok())
        await writer.drain()  # then closes, as a server whose keep-alive timeout passed

    async def scenario() -> None:
        async with serving(once) as (server, client):
            await client.get("/")
            await asyncio.wait_for(server.closed.wait(), 2)
            await asyncio.sleep(0.05)
            assert (await client.get("/")).status_code == 200
            assert server.connections == 2

    asyncio.run(scenario())


def test_connection_close_and_a_body_that_ends_with_the_connection() -> None:
    async def unframed(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await read_request(reader)
        writer.write(b"HTTP/1.1 200 OK\r\nconnection: close\r\n\r\nall of it")
        await writer.drain()

    async def scenario() -> None:
        async with serving(unframed) as (server, client):
            assert (await client.get("/")).text == "all of it"
            assert (await client.get("/")).text == "all of it"
            assert server.connections == 2

    asyncio.run(scenario())


def test_a_server_that_leaves_mid_body_or_before_answering_is_a_protocol_error() -> None:
    async def short(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await read_request(reader)
        writer.write(b"HTTP/1.1 200 OK\r\ncontent-length: 100\r\n\r\nonly this")
        await writer.drain()

    async def silent(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await read_request(reader)

    async def scenario() -> None:
        async with serving(short) as (_, client):
            with pytest.raises(httpx.RemoteProtocolError, match="complete message body"):
                await client.get("/")
        async with serving(silent) as (_, client):
            with pytest.raises(httpx.RemoteProtocolError, match="without sending a response"):
                await client.get("/")

    asyncio.run(scenario())


def test_malformed_http_is_a_protocol_error() -> None:
    async def garbage(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await read_request(reader)
        writer.write(b"SMTP ready\r\n\r\n")
        await writer.drain()
        await asyncio.sleep(1)

    async def scenario() -> None:
        async with serving(garbage) as (_, client):
            with pytest.raises(httpx.RemoteProtocolError, match="malformed"):
                await client.get("/")

    asyncio.run(scenario())


def test_a_slow_server_is_a_read_timeout_and_its_connection_is_dropped() -> None:
    async def scenario() -> None:
        async with serving(unanswered) as (server, client):
            with pytest.raises(httpx.ReadTimeout):
                await client.get("/", timeout=httpx.Timeout(2.0, read=0.1))
            await asyncio.wait_for(server.closed.wait(), 2)

    asyncio.run(scenario())


def test_nothing_listening_is_a_connect_error() -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # bound, not listening: refused

    async def scenario() -> None:
        transport = LeanTransport(max_connections=2, keepalive_expiry=3.0)
        async with httpx.AsyncClient(transport=transport) as client:
            with pytest.raises(httpx.ConnectError):
                await client.get(f"http://127.0.0.1:{port}/")

    asyncio.run(scenario())


def test_requests_beyond_max_connections_wait_for_a_free_one_or_time_out() -> None:
    release = None

    async def held(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        while True:
            await read_request(reader)
            assert release is not None
            await release.wait()
            writer.write(ok())
            await writer.drain()

    async def scenario() -> None:
        nonlocal release
        release = asyncio.Event()
        async with serving(held) as (server, client):
            first = [asyncio.ensure_future(client.get("/")) for _ in range(2)]
            await asyncio.sleep(0.1)
            with pytest.raises(httpx.PoolTimeout):
                await client.get("/", timeout=httpx.Timeout(2.0, pool=0.1))
            third = asyncio.ensure_future(client.get("/"))
            await asyncio.sleep(0.1)
            assert not third.done()
            release.set()
            answers = await asyncio.gather(*first, third)
            assert [a.status_code for a in answers] == [200, 200, 200]
            assert server.connections == 2

    asyncio.run(scenario())


def test_a_cancelled_request_frees_its_slot_and_drops_its_connection() -> None:
    async def scenario() -> None:
        async with serving(unanswered) as (server, client):
            for _ in range(3):  # more than max_connections: each cancel gave its slot back
                task = asyncio.ensure_future(client.get("/"))
                await asyncio.sleep(0.05)
                task.cancel()
                with pytest.raises(asyncio.CancelledError):
                    await task
            assert server.connections == 3

    asyncio.run(scenario())


def test_usable_only_for_plain_http_without_an_environment_proxy(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("HTTP_PROXY", "http_proxy", "ALL_PROXY", "all_proxy"):
        monkeypatch.delenv(name, raising=False)
    assert usable("http://10.0.0.1:8000")
    assert not usable("https://backend:443")
    monkeypatch.setenv("HTTP_PROXY", "http://proxy:3128")
    assert not usable("http://10.0.0.1:8000")
