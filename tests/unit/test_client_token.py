"""The client sends the token the ``farm`` command would when ``token=`` is left out, and a call that
cannot reach the API says which URL it tried."""

from __future__ import annotations

import asyncio
from pathlib import Path

import httpx
import pytest

from farm.client import NO_RETRIES, AsyncFarmClient, FarmClient
from farm.llm.builtin.testing import free_port


def _sent_token(**kwargs: object) -> str | None:
    seen: list[str | None] = []

    def handler(request: httpx.Request) -> httpx.Response:
        seen.append(request.headers.get("authorization"))
        return httpx.Response(200, json={"status": "ok", "checks": {}, "version": "x"})

    with FarmClient("http://farm", transport=httpx.MockTransport(handler), **kwargs) as client:  # type: ignore[arg-type]
        client.health()
    return seen[0]


def test_client_reads_the_token_file_the_cli_reads(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    (tmp_path / "token").write_text("from-file\n")
    monkeypatch.setenv("FARM_DATA_DIR", str(tmp_path))
    assert _sent_token() == "Bearer from-file"
    monkeypatch.setenv("FARM_API__TOKEN", "from-env")  # the setting wins over the file, as for the CLI
    assert _sent_token() == "Bearer from-env"
    assert _sent_token(token="given") == "Bearer given"
    assert _sent_token(token=None) is None  # asked for none: none sent


def test_client_without_a_token_file_sends_none(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setenv("FARM_DATA_DIR", str(tmp_path / "nowhere"))
    assert _sent_token() is None


def test_client_connection_error_names_the_url():
    url = f"http://127.0.0.1:{free_port()}"
    with FarmClient(url, token="t", retry=NO_RETRIES) as client, pytest.raises(httpx.ConnectError) as caught:
        client.health()
    assert f"cannot reach the farm API at {url}/readyz" in str(caught.value)
    assert isinstance(caught.value.__cause__, httpx.ConnectError)  # httpx's own error, kept as the cause

    async def call() -> None:
        async with AsyncFarmClient(url, token="t", retry=NO_RETRIES) as client:
            await client.status(7)

    with pytest.raises(httpx.ConnectError, match=f"cannot reach the farm API at {url}/v1/batches/7"):
        asyncio.run(call())
