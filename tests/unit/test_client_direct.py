"""FarmClient's direct results pages (farm.client.direct) against a real local HTTP server: the
same pages, requests and failures as the httpx path, which each test runs too (a client given an
httpx transport takes it)."""

from __future__ import annotations

import gzip
import json
import os
import socket
import struct
import threading
import time
from collections.abc import Callable, Iterator

import httpx
import numpy as np
import pytest

from farm.client import NO_RETRIES, ApiError, FarmClient, NotFound, Unavailable
from farm.schemas import RESULTS_MEDIA_TYPE, RawArray
from tests.unit.test_client import _binary_body, _item, _page, _with_trajectory

#: how an answer is sent: it gets the connection, returns whether the connection stays open.
Answer = Callable[[socket.socket], bool]
PATHS = ["direct", "httpx"]


class Server:
    """A local HTTP/1.1 server that reads each request's head and sends the next scripted answer."""

    def __init__(self, answers: list[Answer]) -> None:
        self.answers = answers
        self.heads: list[bytes] = []
        self.connections = 0
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.url = f"http://127.0.0.1:{self._listener.getsockname()[1]}"
        self._threads = [threading.Thread(target=self._accept, daemon=True)]
        self._threads[0].start()

    def _accept(self) -> None:
        while True:
            try:
                conn, _ = self._listener.accept()
            except OSError:
                return
            self.connections += 1
            thread = threading.Thread(target=self._serve, args=(conn,), daemon=True)
            self._threads.append(thread)
            thread.start()

    def _serve(self, conn: socket.socket) -> None:
        with conn:
            pending = b""
            while self.answers:
                while b"\r\n\r\n" not in pending:
                    try:
                        data = conn.recv(65536)
                    except OSError:
                        return
                    if not data:
                        return
                    pending += data
                head, _, pending = pending.partition(b"\r\n\r\n")
                self.heads.append(head)
                if not self.answers.pop(0)(conn):
                    return

    def close(self) -> None:
        self._listener.shutdown(socket.SHUT_RDWR)  # wakes the accept (closing alone does not)
        self._listener.close()
        for thread in self._threads:
            thread.join(timeout=5)


@pytest.fixture
def serve(monkeypatch: pytest.MonkeyPatch) -> Iterator[Callable[..., Server]]:
    for key in list(os.environ):
        if key.lower().endswith("_proxy"):
            monkeypatch.delenv(key)
    servers: list[Server] = []

    def start(*answers: Answer) -> Server:
        servers.append(Server(list(answers)))
        return servers[-1]

    yield start
    for server in servers:
        server.close()


def _client(url: str, path: str, **kwargs: object) -> FarmClient:
    """A client that raises every failure at once (its retries: tests/unit/test_client_retry.py)."""
    transport = httpx.HTTPTransport() if path == "httpx" else None
    kwargs.setdefault("retry", NO_RETRIES)
    client = FarmClient(url, token="t", transport=transport, **kwargs)  # type: ignore[arg-type]
    assert (client._direct is not None) == (path == "direct")
    return client


def _head(status: str, headers: dict[str, str]) -> bytes:
    lines = [f"HTTP/1.1 {status}", *(f"{name}: {value}" for name, value in headers.items())]
    return ("\r\n".join(lines) + "\r\n\r\n").encode()


def answer(body: bytes, status: str = "200 OK", content_type: str = RESULTS_MEDIA_TYPE, **headers: str) -> Answer:
    def send(conn: socket.socket) -> bool:
        fields = {"content-type": content_type, "content-length": str(len(body)), **headers}
        conn.sendall(_head(status, fields) + body)
        return True

    return send


def truncated(body: bytes, declared: int) -> Answer:
    def send(conn: socket.socket) -> bool:
        conn.sendall(_head("200 OK", {"content-type": RESULTS_MEDIA_TYPE, "content-length": str(declared)}) + body)
        return False

    return send


def reset_after(part: bytes) -> Answer:
    def send(conn: socket.socket) -> bool:
        conn.sendall(_head("200 OK", {"content-type": RESULTS_MEDIA_TYPE, "content-length": "1000000"}) + part)
        time.sleep(0.05)
        conn.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))  # close with a RST
        return False

    return send


def close_at_once(conn: socket.socket) -> bool:
    return False


def silent(conn: socket.socket) -> bool:
    time.sleep(0.5)
    return False


def _body(n_items: int = 3, seed: int = 0) -> tuple[bytes, list[tuple[np.ndarray, np.ndarray, np.ndarray]]]:
    rng = np.random.default_rng(seed)
    arrays = []
    for i in range(n_items):
        n = 1000 * (i + 1) + 3
        arrays.append(
            (
                rng.integers(-(2**31), 2**31 - 1, n, dtype=np.int32),
                rng.standard_normal(n, dtype=np.float32),
                rng.integers(0, 2, n, dtype=np.uint8),
            )
        )
    items = [_with_trajectory(i + 1, len(a[0])) for i, a in enumerate(arrays)] + [_item(n_items + 1)]
    body = _binary_body(
        items,
        [tuple(a.tolist() for a in arr) for arr in arrays],
        next_cursor=n_items + 1,
        batch_state="complete",
        remaining=0,
        finished=n_items + 1,
    )
    return body, arrays


@pytest.mark.parametrize("path", PATHS)
def test_direct_page_holds_the_exact_bytes_sent(serve, path):
    body, arrays = _body()
    server = serve(answer(body))
    with _client(server.url, path) as client:
        page = client.results_page(1, after=0, page_size=4)
    trajs = [item.trajectory for item in page.items]
    assert trajs[-1] is None and page.next_cursor == 4
    for traj, (ids, logprobs, mask) in zip(trajs, arrays, strict=False):
        assert traj is not None
        got = [traj.token_ids, traj.logprobs, traj.loss_mask]
        assert all(isinstance(a, RawArray) for a in got)
        assert [bytes(a.data) for a in got] == [ids.tobytes(), logprobs.tobytes(), mask.tobytes()]  # type: ignore[union-attr]


def test_direct_request_is_the_one_httpx_sends(serve):
    body, _ = _body(1)
    server = serve(answer(body), answer(body))
    for path in PATHS:
        with _client(server.url, path) as client:
            client.results_page(7, after=3, page_size=5, wait_s=1.5)
    direct, sent_by_httpx = [
        (line, sorted(fields)) for line, *fields in (h.decode().split("\r\n") for h in server.heads)
    ]
    assert direct == sent_by_httpx
    assert direct[0] == "GET /v1/batches/7/results?after=3&limit=5&wait_s=1.5&encoding=b64&trajectories=true HTTP/1.1"
    assert "Authorization: Bearer t" in direct[1]


@pytest.mark.parametrize("path", PATHS)
@pytest.mark.parametrize(
    ("status", "code", "caught"),
    [("404 Not Found", "not_found", NotFound), ("503 Service Unavailable", "unavailable", Unavailable)],
)
def test_direct_error_answers_raise_what_httpx_raises(serve, path, status, code, caught):
    error = json.dumps({"code": code, "detail": "no batch with id 1"}).encode()
    server = serve(answer(error, status, "application/json"))
    with _client(server.url, path) as client, pytest.raises(caught) as info:
        client.results_page(1)
    assert (info.value.status, info.value.code, info.value.detail) == (int(status[:3]), code, "no batch with id 1")


@pytest.mark.parametrize("path", PATHS)
def test_direct_error_without_a_json_body_raises_api_error(serve, path):
    server = serve(answer(b"", "502 Bad Gateway", "text/plain"))
    with _client(server.url, path) as client, pytest.raises(ApiError) as info:
        client.results_page(1)
    assert (info.value.status, info.value.code, info.value.detail) == (502, "http_error", "Bad Gateway")


@pytest.mark.parametrize("path", PATHS)
def test_direct_reads_a_json_page_when_the_server_sends_one(serve, path):
    page = _page([_item(1)], 1, 0, "complete", finished=1)
    server = serve(answer(json.dumps(page).encode(), content_type="application/json"))
    with _client(server.url, path) as client:
        assert [item.seq for item in client.results_page(1).items] == [1]


@pytest.mark.parametrize("path", PATHS)
def test_direct_reads_a_compressed_page_as_httpx_does(serve, path):
    body, arrays = _body(1)
    server = serve(answer(gzip.compress(body), **{"content-encoding": "gzip"}))
    with _client(server.url, path) as client:
        [item, _] = client.results_page(1).items
    assert item.trajectory is not None and bytes(item.trajectory.token_ids.data) == arrays[0][0].tobytes()  # type: ignore[union-attr]


def _failure(server: Server, path: str, **kwargs: object) -> tuple[type[BaseException], str]:
    """The failure's type and httpx's own message (the client's names the URL, httpx's is its cause)."""
    with _client(server.url, path, **kwargs) as client, pytest.raises(httpx.TransportError) as info:
        client.results_page(1)
    assert str(info.value).startswith(f"cannot reach the farm API at {server.url}"), info.value
    return type(info.value), str(info.value.__cause__)


@pytest.mark.parametrize(
    ("answers", "raised"),
    [
        (
            [truncated(b"x" * 40, 100)],
            (
                httpx.RemoteProtocolError,
                "peer closed connection without sending complete message body (received 40 bytes, expected 100)",
            ),
        ),
        ([reset_after(b"x" * 40)], (httpx.ReadError, "[Errno 104] Connection reset by peer")),
        ([close_at_once], (httpx.RemoteProtocolError, "Server disconnected without sending a response.")),
    ],
    ids=["truncated", "reset", "no-answer"],
)
def test_direct_failures_raise_what_httpx_raises(serve, answers, raised):
    got = [_failure(serve(*answers), path) for path in PATHS]
    assert got == [raised, raised]


def test_direct_timeouts_and_refusals_raise_what_httpx_raises(serve):
    assert [_failure(serve(silent), path, timeout_s=0.2) for path in PATHS] == [(httpx.ReadTimeout, "timed out")] * 2
    with socket.create_server(("127.0.0.1", 0)) as taken:
        url = f"http://127.0.0.1:{taken.getsockname()[1]}"  # closed again: nothing listens there
    refused = []
    for path in PATHS:
        with _client(url, path) as client, pytest.raises(httpx.ConnectError) as info:
            client.results_page(1)
        refused.append(str(info.value.__cause__))
    assert refused == ["[Errno 111] Connection refused"] * 2


def test_direct_keeps_its_connection_alive(serve):
    body, _ = _body(1)
    server = serve(answer(body), answer(body), answer(body, connection="close"), answer(body))
    with _client(server.url, "direct") as client:
        for _ in range(4):
            client.results_page(1)
    # One connection for the first three pages; the third's answer said it closes.
    assert server.connections == 2


def test_direct_replaces_a_kept_connection_the_server_closed(serve):
    body, _ = _body(1)

    def answer_then_close(conn: socket.socket) -> bool:
        answer(body)(conn)
        return False  # closed while the client keeps it for the next request

    server = serve(answer_then_close, answer(body))
    with _client(server.url, "direct") as client:
        client.results_page(1)
        time.sleep(0.1)
        assert len(client.results_page(1).items) == 2
    assert server.connections == 2


def test_direct_steps_aside_for_a_transport_a_proxy_or_https(monkeypatch):
    for key in list(os.environ):
        if key.lower().endswith("_proxy"):
            monkeypatch.delenv(key)
    mock = httpx.MockTransport(lambda r: httpx.Response(200))
    for url, transport, direct in [
        ("http://farm", None, True),
        ("http://farm", mock, False),
        ("https://farm", None, False),
    ]:
        with FarmClient(url, token="t", transport=transport) as client:
            assert (client._direct is not None) == direct
    monkeypatch.setenv("HTTP_PROXY", "http://proxy:3128")
    with FarmClient("http://farm", token="t") as client:
        assert client._direct is None
