"""The client's requests and error mapping, against httpx.MockTransport (the transport seam)."""

from __future__ import annotations

import json
import struct
import subprocess
import sys
import time
from typing import Any

import httpx
import numpy as np
import pytest

from farm.client import (
    NO_RETRIES,
    ApiError,
    AsyncFarmClient,
    Conflict,
    FarmClient,
    InvalidSpec,
    NotFound,
    Unauthorized,
    Unavailable,
    UpstreamError,
    to_arrays,
)
from farm.client.base import FIRST_PAGE_SIZE, PREFETCH_PAGES, _plan_ahead
from farm.errors import HandlerNotFound
from farm.schemas import RESULTS_MEDIA_TYPE, ResultsPage


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
    assert seen["body"]["group_size"] == 2 and seen["body"]["sampling"] == {"temperature": 0.5}, "only what was set"


@pytest.mark.parametrize("history", [None, "exact", "template"])
def test_submit_sends_history_only_when_given(history: Any) -> None:
    bodies: list[dict[str, Any]] = []

    def handler(request: httpx.Request) -> httpx.Response:
        bodies.append(json.loads(request.content))
        return httpx.Response(201, json={"id": 7, "job_ids": [1], "created": True})

    with FarmClient("http://farm", token="t", transport=httpx.MockTransport(handler)) as client:
        client.submit([{"type": "echo", "config": {"text": "a"}}], history=history)
    # Unset, the body is one any farm version takes (and the farm's default applies).
    assert bodies[0].get("history", "unset") == (history or "unset")


@pytest.mark.parametrize(
    ("tasks", "options", "field"),
    [
        ([], {}, "tasks"),
        ([{"type": "echo"}], {"group_size": 0}, "group_size"),
        ([{"type": "echo"}], {"sampling": {"temperature": -1}}, "sampling.temperature"),
        ([{"typo": "echo"}], {}, "tasks.0.type"),
        ([{"type": "echo"}], {"history": "verbatim"}, "history"),
    ],
)
def test_submit_refuses_a_bad_batch_as_the_api_would(tasks: Any, options: Any, field: str) -> None:
    def handler(request: httpx.Request) -> httpx.Response:
        raise AssertionError("a batch that cannot be valid is not sent")

    with FarmClient("http://farm", token="t", transport=httpx.MockTransport(handler)) as client:
        with pytest.raises(ApiError) as refused:
            client.submit(tasks, **options)
    assert isinstance(refused.value, InvalidSpec)
    assert (refused.value.status, refused.value.code, refused.value.field) == (422, "invalid_request", field)
    assert refused.value.detail.startswith(f"{field}: ")


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
        (503, "database_unavailable", Unavailable),
        (503, "redis_unavailable", Unavailable),
        (502, "upstream_error", UpstreamError),
    ],
)
def test_each_error_code_raises_the_farm_error_a_trainer_catches(status, code, caught):
    body = {"code": code, "detail": "what to fix", "field": "tasks.0.type"}
    transport = httpx.MockTransport(lambda r: httpx.Response(status, json=body))
    with (
        FarmClient("http://farm", token="t", transport=transport, retry=NO_RETRIES) as client,
        pytest.raises(caught) as info,
    ):
        client.status(1)
    assert isinstance(info.value, ApiError) and (info.value.status, info.value.code) == (status, code)
    assert info.value.field == "tasks.0.type"


def test_an_unknown_task_type_is_bad_input_and_importable_from_the_client():
    import farm.client

    body = {"code": "unknown_task_type", "detail": "unknown task type 'mathh'", "field": "tasks.0.type"}
    transport = httpx.MockTransport(lambda r: httpx.Response(422, json=body))
    with FarmClient("http://farm", token="t", transport=transport) as client, pytest.raises(InvalidSpec) as info:
        client.submit([{"type": "mathh", "config": {}}])
    assert isinstance(info.value, farm.client.HandlerNotFound) and info.value.field == "tasks.0.type"


def test_an_unknown_code_is_a_plain_api_error():
    transport = httpx.MockTransport(lambda r: httpx.Response(418, json={"code": "teapot", "detail": "short"}))
    with FarmClient("http://farm", token="t", transport=transport) as client, pytest.raises(ApiError) as info:
        client.status(1)
    assert type(info.value) is ApiError and not isinstance(info.value, NotFound)


def test_non_json_error_still_raises_api_error():
    transport = httpx.MockTransport(lambda r: httpx.Response(502, text="bad gateway"))
    with (
        FarmClient("http://farm", token="t", transport=transport, retry=NO_RETRIES) as client,
        pytest.raises(ApiError) as info,
    ):
        client.job(3)
    assert info.value.status == 502 and info.value.detail == "bad gateway"


def _page(items: list[dict], cursor: int, remaining: int, state: str = "running", finished: int = 0) -> dict:
    return {"items": items, "next_cursor": cursor, "batch_state": state, "remaining": remaining, "finished": finished}


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
        [
            _page([_item(1)], 1, 1, finished=1),
            _page([], 1, 1, finished=1),
            _page([_item(2)], 2, 0, "complete", finished=2),
        ]
    )
    afters = []

    def handler(request: httpx.Request) -> httpx.Response:
        afters.append(int(request.url.params["after"]))
        return httpx.Response(200, json=next(pages))

    with FarmClient("http://farm", token="t", transport=httpx.MockTransport(handler)) as client:
        seqs = [r.seq for r in client.results(1, wait_s=0)]
    # The page that reached the finished batch's last position ends the stream: no empty page is asked for.
    assert seqs == [1, 2] and afters == [0, 1, 1]


async def _collect(client: AsyncFarmClient) -> list[int]:
    return [r.seq async for r in client.results(1, wait_s=0)]


def test_async_client_results():
    import asyncio

    pages = iter([_page([_item(1), _item(2)], 2, 0, "complete", finished=2)])

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


def test_only_the_trainer_side_imports_the_client():
    from tests.unit.test_layers import _imports, _modules

    # What the farm itself runs (workers, proxy, LLM layer) shares code with the client only through layer 0.
    trainer_side = {
        "farm.client",
        "farm.bridges",
        "farm.learning",
        "farm.cli",
        "farm.demo",
        "farm.progress",
        "farm.report",
    }
    server_side = {
        f"{module} imports {name}"
        for module, path in _modules()
        if ".".join(module.split(".")[:2]) not in trainer_side
        for name in _imports(path)
        if name == "farm.client" or name.startswith("farm.client.")
    }
    assert server_side == set()


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


def _binary_body(items: list[dict], arrays: list[tuple[list[int], list[float], list[int]]], **page) -> bytes:
    """A binary results page built by hand from docs/api.md's layout (as a non-Python client reads it)."""
    data = bytearray()
    trajs = iter(arrays)
    for item in items:
        if item["trajectory"] is None:
            continue
        ids, logprobs, mask = next(trajs)
        for name, values, dtype in (
            ("token_ids", ids, "<i4"),
            ("logprobs", logprobs, "<f4"),
            ("loss_mask", mask, "u1"),
        ):
            data += bytes(-len(data) % 8)
            item["trajectory"][name] = {"dtype": np.dtype(dtype).name, "offset": len(data), "length": len(values)}
            data += np.asarray(values, dtype).tobytes()
    header = json.dumps({"items": items, **page}).encode()
    header += b" " * (-(8 + len(header)) % 8)
    return b"FRP1" + struct.pack("<I", len(header)) + header + bytes(data)


def _with_trajectory(seq: int, n: int) -> dict:
    item = _item(seq)
    item["trajectory"] = {
        "job_id": seq,
        "batch_id": 1,
        "group_id": 1,
        "encoding": "binary",
        "num_tokens": n,
        "turn_offsets": [0],
        "reward": 0.5,
        "metrics": {},
        "timings": {},
        "info": {},
    }
    return item


def test_async_client_reads_binary_pages_into_arrays():
    import asyncio

    arrays = [([1, 2, 3], [0.0, -0.5, -1.0], [0, 1, 1]), ([7], [-2.0], [1])]
    body = _binary_body(
        [_with_trajectory(1, 3), _item(2), _with_trajectory(3, 1)],
        arrays,
        next_cursor=3,
        batch_state="complete",
        remaining=0,
        finished=3,
    )
    pages = iter([body])
    accepts = []

    def handler(request: httpx.Request) -> httpx.Response:
        accepts.append(request.headers["accept"])
        return httpx.Response(200, content=next(pages), headers={"content-type": RESULTS_MEDIA_TYPE})

    async def main() -> list:
        async with AsyncFarmClient("http://farm", token="t", transport=httpx.MockTransport(handler)) as client:
            return [r async for r in client.results(1, wait_s=0)]

    results = asyncio.run(main())
    assert [r.seq for r in results] == [1, 2, 3] and results[1].trajectory is None
    assert all(a.startswith(RESULTS_MEDIA_TYPE) for a in accepts)
    out = to_arrays([r.trajectory for r in results if r.trajectory])
    assert out["input_ids"].tolist() == [[1, 2, 3], [7, 0, 0]]
    assert out["old_logprobs"].tolist() == [[0.0, -0.5, -1.0], [-2.0, 0.0, 0.0]]
    assert out["loss_mask"].tolist() == [[0, 1, 1], [1, 0, 0]]


@pytest.mark.parametrize(
    "body",
    [
        b"",
        b"{}",
        b"FRP2" + bytes(8),
        _binary_body(
            [_with_trajectory(1, 4)],
            [([1] * 4, [0.0] * 4, [0] * 4)],
            next_cursor=1,
            batch_state="complete",
            remaining=0,
            finished=1,
        )[:-3],
    ],
)
def test_bad_binary_page_raises_api_error(body: bytes):
    transport = httpx.MockTransport(
        lambda r: httpx.Response(200, content=body, headers={"content-type": RESULTS_MEDIA_TYPE})
    )
    with FarmClient("http://farm", token="t", transport=transport) as client, pytest.raises(ApiError) as info:
        client.results_page(1)
    assert info.value.code == "bad_page"


def test_results_requests_pages_of_a_finished_batch_ahead():
    # Given a finished batch of 5 results, read 2 at a time
    afters: list[int] = []

    def handler(request: httpx.Request) -> httpx.Response:
        after, limit = int(request.url.params["after"]), int(request.url.params["limit"])
        afters.append(after)
        seqs = range(after + 1, min(after + limit, 5) + 1)
        page = _page([_item(s) for s in seqs], seqs[-1] if seqs else after, 0, "complete", finished=5)
        return httpx.Response(200, json=page)

    with FarmClient("http://farm", token="t", transport=httpx.MockTransport(handler)) as client:
        results = client.results(1, wait_s=0, page_size=2)
        # When the caller holds the first result, the pages after it are asked for already
        first = next(results)
        deadline = time.monotonic() + 5
        while len(afters) < 3 and time.monotonic() < deadline:
            time.sleep(0.01)
        assert sorted(afters[1:]) == [2, 4][:PREFETCH_PAGES]
        rest = list(results)
    # Then every result comes once, in order, and no page past the last position is asked for
    assert [first.seq] + [r.seq for r in rest] == [1, 2, 3, 4, 5]
    assert sorted(afters) == [0, 2, 4]


def test_results_start_with_a_small_page_then_read_ahead_in_full_pages():
    # Given a finished batch of 30 results, read 20 at a time
    requests: list[tuple[int, int]] = []

    def handler(request: httpx.Request) -> httpx.Response:
        after, limit = int(request.url.params["after"]), int(request.url.params["limit"])
        requests.append((after, limit))
        seqs = range(after + 1, min(after + limit, 30) + 1)
        return httpx.Response(200, json=_page([_item(s) for s in seqs], seqs[-1], 0, "complete", finished=30))

    with FarmClient("http://farm", token="t", transport=httpx.MockTransport(handler)) as client:
        seqs = [r.seq for r in client.results(1, wait_s=0, page_size=20)]
    # Then the first page is small, the rest full pages up to the last position, each result once
    assert seqs == list(range(1, 31))
    assert sorted(requests) == [(0, FIRST_PAGE_SIZE), (FIRST_PAGE_SIZE, 20), (FIRST_PAGE_SIZE + 20, 20)]


def test_plan_ahead_speculates_only_on_a_finished_batch():
    full = ResultsPage.model_validate(_page([_item(1), _item(2)], 2, 0, "complete", finished=20))
    assert _plan_ahead(full, 2, []) == (False, [2, 4, 6][:PREFETCH_PAGES])
    assert _plan_ahead(full, 2, [2, 4]) == (True, [6][: PREFETCH_PAGES - 2])
    # A page that is not where the requested ones assumed: those are dropped and asked again.
    assert _plan_ahead(full, 2, [3, 5]) == (False, [2, 4, 6][:PREFETCH_PAGES])
    running = ResultsPage.model_validate(_page([_item(1), _item(2)], 2, 3, "running", finished=20))
    assert _plan_ahead(running, 2, []) == (False, [2])


def test_plan_ahead_asks_for_nothing_past_a_finished_batchs_last_position():
    # Positions 1..5 are taken: after the page ending at 2, only the pages from 2 and 4 hold any.
    full = ResultsPage.model_validate(_page([_item(1), _item(2)], 2, 0, "complete", finished=5))
    assert _plan_ahead(full, 2, []) == (False, [2, 4])
    last = ResultsPage.model_validate(_page([_item(5)], 5, 0, "complete", finished=5))
    assert _plan_ahead(last, 2, [5]) == (False, [])
    # A running batch's empty page with jobs left: ask again (a long-poll); without: the end.
    waiting = ResultsPage.model_validate(_page([], 5, 1, "running", finished=5))
    assert _plan_ahead(waiting, 2, []) == (False, [5])
    done = ResultsPage.model_validate(_page([], 5, 0, "running", finished=5))
    assert _plan_ahead(done, 2, []) == (False, [])


@pytest.mark.parametrize("declared", [-1, +1])
def test_binary_page_of_another_length_than_declared_raises_api_error(declared: int):
    body = _binary_body([], [], next_cursor=0, batch_state="running", remaining=1, finished=0)
    headers = {"content-type": RESULTS_MEDIA_TYPE, "content-length": str(len(body) + declared)}
    transport = httpx.MockTransport(lambda r: httpx.Response(200, content=body, headers=headers))
    with FarmClient("http://farm", token="t", transport=transport) as client, pytest.raises(ApiError) as info:
        client.results_page(1)
    assert info.value.code == "bad_page"


def test_the_sync_and_async_clients_offer_the_same_calls_with_the_same_parameters():
    import inspect

    def calls(cls: type) -> dict[str, list[str]]:
        return {
            name: list(inspect.signature(member).parameters)
            for name, member in inspect.getmembers(cls, inspect.isfunction)
            if not name.startswith("_")
        }

    sync, async_ = calls(FarmClient), calls(AsyncFarmClient)
    assert sync == async_
    streams = ("results", "groups")  # async generators
    assert all(inspect.iscoroutinefunction(getattr(AsyncFarmClient, name)) for name in async_ if name not in streams)
