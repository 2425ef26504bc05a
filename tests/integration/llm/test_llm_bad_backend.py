"""Backends that misbehave over real sockets: clear errors naming the backend, an infra outcome, no hang."""

from __future__ import annotations

import asyncio
import socket
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from farm.errors import UpstreamConnectError, UpstreamError, UpstreamStatusError, UpstreamTimeout
from farm.llm.builtin.testing import free_port
from farm.llm.client import SGLangClient, VLLMClient
from farm.llm.types import GenerateRequest

REQUEST = GenerateRequest(prompt_token_ids=[1, 2, 3])


async def generate(client):
    async with client:
        return await client.generate(REQUEST)


class _Garbage(BaseHTTPRequestHandler):
    def do_POST(self):  # noqa: N802 - http.server's naming
        self.rfile.read(int(self.headers["Content-Length"]))
        body = b"<html>502 bad gateway from a proxy</html>"
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args):
        pass


@pytest.fixture
def garbage_server():
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Garbage)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()
    server.server_close()


@pytest.fixture
def silent_server():
    """Accepts TCP connections (the kernel completes the handshake) and never answers."""
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    sock.listen(16)
    yield f"http://127.0.0.1:{sock.getsockname()[1]}"
    sock.close()


def test_backend_url_that_does_not_answer_is_a_connect_error():
    url = f"http://127.0.0.1:{free_port()}"  # nothing listens there
    client = VLLMClient(base_url=url, backend_id="gone", model="m", connect_retries=1)
    with pytest.raises(UpstreamConnectError, match="cannot connect") as info:
        asyncio.run(generate(client))
    assert info.value.context["backend"] == "gone"
    assert info.value.outcome == "infra_error"


def test_backend_that_never_answers_times_out(silent_server):
    client = VLLMClient(base_url=silent_server, model="m", api="completions", timeout_s=0.5)
    with pytest.raises(UpstreamTimeout, match="did not answer in time"):
        asyncio.run(generate(client))


@pytest.mark.parametrize("make", [VLLMClient, SGLangClient])
def test_backend_sending_malformed_json_is_an_upstream_error(garbage_server, make):
    kwargs = {"model": "m", "api": "completions"} if make is VLLMClient else {}
    with pytest.raises(UpstreamError, match="malformed JSON") as info:
        asyncio.run(generate(make(base_url=garbage_server, **kwargs)))
    assert garbage_server in str(info.value)


def test_unknown_model_on_a_real_backend_says_so(builtin_server):
    client = VLLMClient(base_url=builtin_server.url, model="gpt-17", api="completions")
    with pytest.raises(UpstreamStatusError, match="`gpt-17` does not exist") as info:
        asyncio.run(generate(client))
    assert info.value.status == 404
