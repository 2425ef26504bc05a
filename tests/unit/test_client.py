"""The client's requests and error mapping, against httpx.MockTransport (the transport seam)."""

from __future__ import annotations

import json
import subprocess
import sys
from typing import Any

import httpx
import pytest

from farm.client import (
    ApiError,
    AsyncFarmClient,
    Conflict,
    FarmClient,
    InvalidSpec,
    NotFound,
    Unauthorized,
    Unavailable,
    UpstreamError,
)
from farm.errors import HandlerNotFound


def test_submit_sends_bearer_token_body_and_idempotency_key():
    seen: dict[str, Any] = {}

    def handler(request: httpx.Request) -> httpx.Response:
        seen.update(
            auth=request.headers["authorization"],
            key=request.headers.get("idempotency-key"),
            body=json.loads(request.content),
            path=request.url.path,
        )
        return httpx.Response(201, json={"id": 7, "job_ids": [1, 2], "created": True})

    with FarmClient("http://farm", token="t0k", transport=httpx.MockTransport(handler)) as client:
        created = client.submit(
            [{"type": "echo", "config": {"text": "a"}}],
            group_size=2,
            idempotency_key="k1",
            sampling={"temperature": 0.5},
        )
    assert created.id == 7 and created.job_ids == [1, 2]
    assert seen["auth"] == "Bearer t0k" and seen["key"] == "k1" and seen["path"] == "/v1/batches"
    assert seen["body"]["group_size"] == 2 and seen["body"]["sampling"]["temperature"] == 0.5


def test_error_answer_raises_api_error_with_code_and_detail():
    transport = httpx.MockTransport(
        lambda r: httpx.Response(422, json={"code": "invalid_spec", "detail": "tasks.0.config.text: too short"})
    )
    with FarmClient("http://farm", token="t", transport=transport) as client, pytest.raises(ApiError) as info:
        client.status(1)
    assert (info.value.status, info.value.code) == (422, "invalid_spec")
    assert "tasks.0.config.text" in info.value.detail


@pytest.mark.parametrize(
    ("status", "code", "caught"),
    [
        (404, "not_found", NotFound),
        (422, "unknown_task_type", HandlerNotFound),
        (422, "invalid_request", InvalidSpec),
        (409, "conflict", Conflict),
        (401, "unauthorized", Unauthorized),
        (503, "unavailable", Unavailable),
        (502, "upstream_error", UpstreamError),
    ],
)
def test_each_error_code_raises_the_farm_error_a_trainer_catches(status, code, caught):
    body = {"code": code, "detail": "what to fix", "field": "tasks.0.type"}
    transport = httpx.MockTransport(lambda r: httpx.Response(status, json=body))
    with FarmClient("http://farm", token="t", transport=transport) as client, pytest.raises(caught) as info:
        client.status(1)
    assert isinstance(info.value, ApiError) and (info.value.status, info.value.code) == (status, code)
    assert info.value.field == "tasks.0.type"


def test_an_unknown_code_is_a_plain_api_error():
    transport = httpx.MockTransport(lambda r: httpx.Response(418, json={"code": "teapot", "detail": "short"}))
    with FarmClient("http://farm", token="t", transport=transport) as client, pytest.raises(ApiError) as info:
        client.status(1)
    assert type(info.value) is ApiError and not isinstance(info.value, NotFound)


def test_non_json_error_still_raises_api_error():
    transport = httpx.MockTransport(lambda r: httpx.Response(502, text="bad gateway"))
    with FarmClient("http://farm", token="t", transport=transport) as client, pytest.raises(ApiError) as info:
        client.job(3)
    assert info.value.status == 502 and info.value.detail == "bad gateway"


def test_invalid_spec_is_refused_before_sending():
    transport = httpx.MockTransport(lambda r: pytest.fail("nothing should be sent"))
    with FarmClient("http://farm", token="t", transport=transport) as client, pytest.raises(ValueError):
        client.submit([{"type": "echo"}], group_size=0)


def _page(items: list[dict], cursor: int, remaining: int, state: str = "running") -> dict:
    return {"items": items, "next_cursor": cursor, "batch_state": state, "remaining": remaining}


def _item(seq: int) -> dict:
    job = {
        "id": seq,
        "batch_id": 1,
        "group_id": 1,
        "group_index": 0,
        "sample_index": seq,
        "type": "echo",
        "state": "done",
        "outcome": "ok",
        "reason": None,
        "attempts": 3,
        "node": "n",
        "reward": 1.0,
        "created_at": "2026-01-01T00:00:00Z",
        "init_at": None,
        "run_at": None,
        "eval_at": None,
        "finished_at": None,
    }
    return {"seq": seq, "job": job, "trajectory": None}


def test_results_follows_the_cursor_until_nothing_remains():
    pages = iter(
        [_page([_item(1)], 1, 1), _page([], 1, 1), _page([_item(2)], 2, 0, "complete"), _page([], 2, 0, "complete")]
    )
    afters = []

    def handler(request: httpx.Request) -> httpx.Response:
        afters.append(int(request.url.params["after"]))
        return httpx.Response(200, json=next(pages))

    with FarmClient("http://farm", token="t", transport=httpx.MockTransport(handler)) as client:
        seqs = [r.seq for r in client.results(1, wait_s=0)]
    assert seqs == [1, 2] and afters == [0, 1, 1, 2]


async def _collect(client: AsyncFarmClient) -> list[int]:
    return [r.seq async for r in client.results(1, wait_s=0)]


def test_async_client_results():
    import asyncio

    pages = iter([_page([_item(1), _item(2)], 2, 0, "complete"), _page([], 2, 0, "complete")])

    async def main() -> list[int]:
        transport = httpx.MockTransport(lambda r: httpx.Response(200, json=next(pages)))
        async with AsyncFarmClient("http://farm", token="t", transport=transport) as client:
            return await _collect(client)

    assert asyncio.run(main()) == [1, 2]


def test_client_imports_nothing_of_the_server_side():
    code = (
        "import sys, farm.client\n"
        "heavy = {'sqlalchemy', 'celery', 'fastapi', 'redis', 'kombu', 'starlette', 'pydantic_settings', 'alembic'}\n"
        "print(sorted({m.split('.')[0] for m in sys.modules} & heavy))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"


def test_tasks_asks_for_one_family_or_all_and_parses_them():
    seen: list[str] = []

    def handler(request: httpx.Request) -> httpx.Response:
        seen.append(str(request.url))
        body = [{"type": "math", "tasks": [{"id": "p1", "config": {"problem_id": "p1"}, "about": "algebra"}]}]
        return httpx.Response(200, json=body)

    with FarmClient("http://farm", token="t", transport=httpx.MockTransport(handler)) as client:
        [family] = client.tasks("math")
        client.tasks()
    assert family.type == "math" and family.tasks[0].config == {"problem_id": "p1"}
    assert seen == ["http://farm/v1/tasks?type=math", "http://farm/v1/tasks"]
