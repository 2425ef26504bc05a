"""Every call of the two clients sends the request ``farm.client.base`` builds: the same one from
``FarmClient`` and ``AsyncFarmClient``; and the polling and cursors that each client drives
(``wait``, ``groups``, the results pages requested ahead)."""

from __future__ import annotations

import asyncio
import inspect
from typing import Any

import httpx
import pytest

from farm.client import AsyncFarmClient, CarryCursor, FarmClient, NotFound
from farm.client.base import PagesAhead
from farm.schemas import RESULTS_MEDIA_TYPE, ResultsPage
from tests.unit.test_client import _item, _page

_BINARY = f"{RESULTS_MEDIA_TYPE}, application/json;q=0.5"

#: call, its arguments, and the request it sends: method, URL, read timeout (s), Accept, body.
CALLS: list[tuple[str, tuple[Any, ...], dict[str, Any], str, str, float, str, bytes]] = [
    ("health", (), {}, "GET", "/readyz", 30, "*/*", b""),
    ("handlers", (), {}, "GET", "/v1/handlers", 30, "*/*", b""),
    ("tasks", ("math",), {}, "GET", "/v1/tasks?type=math", 30, "*/*", b""),
    (
        "submit",
        ([{"type": "echo", "config": {}}],),
        {"group_size": 2, "idempotency_key": "k1"},
        "POST",
        "/v1/batches",
        30,
        "*/*",
        b'{"tasks":[{"type":"echo","config":{},"name":null}],"group_size":2,"sampling":{},"metadata":{}}',
    ),
    ("overview", (), {}, "GET", "/v1/overview", 30, "*/*", b""),
    ("status", (3,), {}, "GET", "/v1/batches/3", 30, "*/*", b""),
    ("cancel", (3,), {}, "POST", "/v1/batches/3/cancel", 30, "*/*", b""),
    ("job", (4,), {}, "GET", "/v1/jobs/4", 30, "*/*", b""),
    ("trajectory", (4,), {"encoding": "json"}, "GET", "/v1/jobs/4/trajectory?encoding=json", 30, "*/*", b""),
    (
        "groups_page",
        (3,),
        {"after": 2, "limit": 4, "wait_s": 5},
        "GET",
        "/v1/batches/3/groups?after=2&limit=4&wait_s=5&encoding=b64",
        35,
        "*/*",
        b"",
    ),
    (
        "groups",
        (3,),
        {"wait_s": 5},
        "GET",
        "/v1/batches/3/groups?after=0&limit=16&wait_s=5&encoding=b64",
        35,
        "*/*",
        b"",
    ),
    ("pass_rates", (["a", "b"],), {"type": "math"}, "GET", "/v1/pass-rates?key=a&key=b&type=math", 30, "*/*", b""),
    ("weights", (), {}, "GET", "/v1/weights", 30, "*/*", b""),
    (
        "pause",
        (),
        {"mode": "abort", "timeout_s": 60},
        "POST",
        "/v1/weights/pause",
        900,
        "*/*",
        b'{"mode":"abort","proxy":"wait","timeout_s":60.0}',
    ),
    (
        "load_weights",
        (5,),
        {"path": "/ckpt", "version": 2},
        "POST",
        "/v1/weights/updates/5/load",
        900,
        "*/*",
        b'{"path":"/ckpt","version":2}',
    ),
    ("resume", (5,), {"version": 2}, "POST", "/v1/weights/updates/5/resume", 900, "*/*", b'{"version":2}'),
    ("rollback", (5,), {}, "POST", "/v1/weights/updates/5/rollback", 900, "*/*", b""),
    (
        "results_page",
        (3,),
        {"after": 1, "page_size": 2, "wait_s": 5},
        "GET",
        "/v1/batches/3/results?after=1&limit=2&wait_s=5&encoding=b64&trajectories=true",
        35,
        _BINARY,
        b"",
    ),
    (
        "results",
        (3,),
        {"wait_s": 5, "encoding": "json", "trajectories": False},
        "GET",
        "/v1/batches/3/results?after=0&limit=8&wait_s=5&encoding=json&trajectories=false",
        35,
        "*/*",
        b"",
    ),
    ("wait", (3,), {}, "GET", "/v1/batches/3", 30, "*/*", b""),
    ("tail", (3,), {}, "GET", "/v1/batches/3/tail", 30, "*/*", b""),
    (
        "step",
        (3,),
        {"wait_s": 5},
        "GET",
        "/v1/batches/3/results?after=0&limit=100&wait_s=5&encoding=b64&trajectories=true&until_ready=true",
        35,
        _BINARY,
        b"",
    ),
    (
        "carried",
        (CarryCursor({3: 7}),),
        {},
        "GET",
        "/v1/batches/3/results?after=7&limit=100&wait_s=0&encoding=b64&trajectories=true",
        30,
        _BINARY,
        b"",
    ),
    (
        "create_trial",
        ("t1",),
        {"sampling": {"temperature": 1.0}, "history": "template", "job_id": 4},
        "POST",
        "/v1/trials",
        30,
        "*/*",
        b'{"id":"t1","job_id":4,"sampling":{"temperature":1.0},"history":"template","metadata":{}}',
    ),
    ("trial", ("t1",), {}, "GET", "/v1/trials/t1", 30, "*/*", b""),
    ("end_trial", ("t1",), {}, "POST", "/v1/trials/t1/end", 30, "*/*", b""),
    ("trial_record", ("t1",), {}, "GET", "/v1/trials/t1/record?encoding=b64", 30, "*/*", b""),
    ("delete_trial", ("t1",), {}, "DELETE", "/v1/trials/t1", 30, "*/*", b""),
]


def _seen(request: httpx.Request) -> tuple[str, str, float, str, bytes, str, str | None]:
    return (
        request.method,
        str(request.url).removeprefix("http://farm"),
        request.extensions["timeout"]["read"],
        request.headers["accept"],
        request.read(),
        request.headers["authorization"],
        request.headers.get("idempotency-key"),
    )


def _not_found(seen: list[Any]) -> httpx.MockTransport:
    def answer(request: httpx.Request) -> httpx.Response:
        seen.append(_seen(request))
        return httpx.Response(404, json={"code": "not_found", "detail": "no such thing"})

    return httpx.MockTransport(answer)


def _sync_request(name: str, args: tuple[Any, ...], kwargs: dict[str, Any]) -> list[Any]:
    seen: list[Any] = []
    with FarmClient("http://farm", token="t", transport=_not_found(seen)) as client, pytest.raises(NotFound):
        out = getattr(client, name)(*args, **kwargs)
        list(out)  # a stream sends on its first step
    return seen


def _async_request(name: str, args: tuple[Any, ...], kwargs: dict[str, Any]) -> list[Any]:
    seen: list[Any] = []

    async def main() -> None:
        async with AsyncFarmClient("http://farm", token="t", transport=_not_found(seen)) as client:
            with pytest.raises(NotFound):
                call = getattr(client, name)(*args, **kwargs)
                if inspect.isasyncgen(call):
                    [item async for item in call]
                else:
                    await call

    asyncio.run(main())
    return seen


@pytest.mark.parametrize(
    ("name", "args", "kwargs", "method", "url", "timeout", "accept", "body"), CALLS, ids=[c[0] for c in CALLS]
)
def test_both_clients_send_each_call_as_the_base_builds_it(
    name: str, args: Any, kwargs: Any, method: str, url: str, timeout: float, accept: str, body: bytes
) -> None:
    key = "k1" if name == "submit" else None
    expected = [(method, url, timeout, accept, body, "Bearer t", key)]
    assert _sync_request(name, args, kwargs) == expected
    assert _async_request(name, args, kwargs) == expected


def test_every_call_is_in_the_table():
    public = {name for name, _ in inspect.getmembers(FarmClient, inspect.isfunction) if not name.startswith("_")}
    assert public - {"close"} == {call[0] for call in CALLS}


def _status(state: str) -> dict[str, Any]:
    return {
        "id": 3,
        "state": state,
        "created_at": "2026-01-01T00:00:00Z",
        "finished_at": None,
        "group_size": 1,
        "total_jobs": 1,
        "finished_jobs": 0,
        "counts": {"queued": 1},
        "outcomes": {},
        "metadata": {},
    }


def _statuses(*states: str) -> httpx.MockTransport:
    answers = iter(states)
    return httpx.MockTransport(lambda r: httpx.Response(200, json=_status(next(answers))))


def test_wait_polls_until_the_batch_no_longer_runs():
    with FarmClient("http://farm", token="t", transport=_statuses("running", "running", "complete")) as client:
        assert client.wait(3, poll_s=0).state == "complete"

    async def main() -> str:
        transport = _statuses("running", "cancelled")
        async with AsyncFarmClient("http://farm", token="t", transport=transport) as client:
            return (await client.wait(3, poll_s=0)).state

    assert asyncio.run(main()) == "cancelled"


def test_wait_gives_up_after_its_timeout():
    with FarmClient("http://farm", token="t", transport=_statuses(*["running"] * 3)) as client:
        with pytest.raises(TimeoutError, match="batch 3 still running after 0"):
            client.wait(3, timeout_s=0, poll_s=0)

    async def main() -> None:
        async with AsyncFarmClient("http://farm", token="t", transport=_statuses(*["running"] * 3)) as client:
            await client.wait(3, timeout_s=0, poll_s=0)

    with pytest.raises(TimeoutError, match="batch 3 still running after 0"):
        asyncio.run(main())


def _group(seq: int) -> dict[str, Any]:
    return {
        "seq": seq,
        "group_id": seq,
        "index": 0,
        "name": None,
        "reward_mean": 0.5,
        "reward_std": 0.5,
        "rewards": [0, 1],
        "results": [],
    }


def _groups_page(seqs: list[int], cursor: int, state: str) -> dict[str, Any]:
    items = [_group(s) for s in seqs]
    return {
        "items": items,
        "next_cursor": cursor,
        "batch_state": state,
        "informative": cursor,
        "target_groups": 3,
        "end_reason": None,
    }


GROUP_PAGES = [
    _groups_page([1], 1, "running"),
    _groups_page([], 1, "running"),
    _groups_page([2, 3], 3, "complete"),
    _groups_page([], 3, "complete"),
]


def _groups_transport(afters: list[int]) -> httpx.MockTransport:
    pages = iter(GROUP_PAGES)

    def answer(request: httpx.Request) -> httpx.Response:
        afters.append(int(request.url.params["after"]))
        return httpx.Response(200, json=next(pages))

    return httpx.MockTransport(answer)


def test_groups_follow_the_cursor_until_an_empty_page_of_a_finished_batch():
    afters: list[int] = []
    with FarmClient("http://farm", token="t", transport=_groups_transport(afters)) as client:
        assert [g.seq for g in client.groups(3, wait_s=0)] == [1, 2, 3]
    assert afters == [0, 1, 1, 3]

    async def main() -> list[int]:
        async with AsyncFarmClient("http://farm", token="t", transport=_groups_transport(afters)) as client:
            return [g.seq async for g in client.groups(3, wait_s=0)]

    afters.clear()
    assert asyncio.run(main()) == [1, 2, 3]
    assert afters == [0, 1, 1, 3]


def test_pages_ahead_drops_the_pages_requested_for_another_cursor():
    # Given pages from 2 and 4 requested ahead of a finished batch read 2 at a time
    requested: list[int] = []
    cancelled: list[int] = []

    def request(cursor: int) -> int:
        requested.append(cursor)
        return cursor

    ahead: PagesAhead[int] = PagesAhead(2, request, cancelled.append)
    first = ResultsPage.model_validate(_page([_item(1), _item(2)], 2, 0, "complete", finished=9))
    assert ahead.plan(first) and requested == [2, 4, 6]
    assert ahead.next() == 2
    # When the page from 2 ends at 3, not at 4
    short = ResultsPage.model_validate(_page([_item(3)], 3, 0, "complete", finished=9))
    assert ahead.plan(short)
    # Then the pages from 4 and 6 are given up and the ones from 3 on requested instead
    assert cancelled == [4, 6] and requested[3:] == [3, 5, 7]
    assert [ahead.next(), ahead.next(), ahead.next()] == [3, 5, 7]
