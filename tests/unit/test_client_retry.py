"""The trainer's client retries what says retry (farm.client.retry), at the transport seam: httpx's
MockTransport answers (or fails) as a restarting API would, and the client's requests are counted."""

from __future__ import annotations

import asyncio
import random
from collections.abc import Callable, Iterator

import httpx
import pytest

from farm.client import NO_RETRIES, ApiError, AsyncFarmClient, FarmClient, RetryPolicy, Unavailable, UpstreamError
from farm.client.retry import idempotent
from tests.unit.test_client import _item, _page

#: fast waits, a bound no test reaches unless it means to.
QUICK = RetryPolicy(total_s=30.0, base_s=0.001, max_s=0.005)

Answer = Callable[[httpx.Request], httpx.Response]

#: a weight update as the API answers it.
UPDATE = {
    "id": 7,
    "mode": "keep",
    "phase": "paused",
    "open": True,
    "proxy": "wait",
    "from_version": 0,
    "to_version": None,
    "load_path": None,
    "deadline": "2026-01-01T00:15:00Z",
    "error": None,
    "created_at": "2026-01-01T00:00:00Z",
    "finished_at": None,
    "backends": [],
}


def _unavailable(code: str = "database_unavailable") -> httpx.Response:
    return httpx.Response(503, json={"code": code, "detail": "the database is unreachable or restarting"})


def _fail(exc: type[httpx.TransportError]) -> Answer:
    def answer(request: httpx.Request) -> httpx.Response:
        raise exc("down", request=request)

    return answer


class Script:
    """Answers requests in order from ``answers``, then with ``then``; keeps every request."""

    def __init__(self, answers: list[Answer], then: Answer) -> None:
        self.requests: list[httpx.Request] = []
        self._answers: Iterator[Answer] = iter(answers)
        self._then = then

    def __call__(self, request: httpx.Request) -> httpx.Response:
        self.requests.append(request)
        return next(self._answers, self._then)(request)

    def client(self, retry: RetryPolicy = QUICK) -> FarmClient:
        return FarmClient("http://farm", token="t", transport=httpx.MockTransport(self), retry=retry)


@pytest.mark.parametrize("code", ["database_unavailable", "redis_unavailable", "unavailable"])
def test_a_get_answered_503_with_a_retryable_code_is_sent_again_until_it_succeeds(code):
    script = Script([lambda r: _unavailable(code)] * 3, lambda r: httpx.Response(200, json=[]))
    with script.client() as client:
        assert client.handlers() == []
    assert len(script.requests) == 4


def test_a_503_whose_code_does_not_say_retry_is_raised_at_once():
    script = Script([], lambda r: httpx.Response(503, json={"code": "sandbox_check_failed", "detail": "x"}))
    with script.client() as client, pytest.raises(ApiError) as info:
        client.handlers()
    assert info.value.status == 503 and len(script.requests) == 1


def test_a_gateway_502_is_retried_but_the_apis_own_upstream_error_is_not():
    gateway = Script([lambda r: httpx.Response(502, text="bad gateway")], lambda r: httpx.Response(200, json=[]))
    with gateway.client() as client:
        assert client.handlers() == []
    assert len(gateway.requests) == 2
    upstream = Script([], lambda r: httpx.Response(502, json={"code": "upstream_error", "detail": "backend died"}))
    with upstream.client() as client, pytest.raises(UpstreamError):
        client.handlers()
    assert len(upstream.requests) == 1


@pytest.mark.parametrize("failure", [httpx.ConnectError, httpx.ConnectTimeout])
def test_a_request_that_never_reached_the_server_is_sent_again_even_a_weight_update(failure):
    script = Script([_fail(failure)] * 2, lambda r: httpx.Response(200, json=UPDATE))
    with script.client() as client:
        assert client.pause().phase == "paused"
    assert len(script.requests) == 3


@pytest.mark.parametrize("failure", [httpx.ReadError, httpx.RemoteProtocolError, httpx.ReadTimeout])
def test_a_get_whose_answer_was_lost_is_sent_again(failure):
    script = Script([_fail(failure)], lambda r: httpx.Response(200, json=[]))
    with script.client() as client:
        assert client.handlers() == []
    assert len(script.requests) == 2


@pytest.mark.parametrize("failure", [httpx.ReadError, httpx.RemoteProtocolError])
def test_a_weight_update_that_may_have_reached_the_server_is_not_sent_again(failure):
    script = Script([], _fail(failure))
    with script.client() as client, pytest.raises(failure):
        client.pause()
    assert len(script.requests) == 1


def test_a_weight_update_answered_503_is_not_sent_again():
    script = Script([], lambda r: _unavailable())
    with script.client() as client, pytest.raises(Unavailable):
        client.resume(7)
    assert len(script.requests) == 1


def _created(request: httpx.Request) -> httpx.Response:
    return httpx.Response(200, json={"id": 5, "job_ids": [1], "created": True})


@pytest.mark.parametrize("given", [None, "trainer-step-12"])
def test_a_submit_carries_an_idempotency_key_and_is_sent_again_with_the_same_one(given):
    script = Script([lambda r: _unavailable(), _fail(httpx.ReadError)], _created)
    with script.client() as client:
        created = client.submit([{"type": "echo", "config": {}}], idempotency_key=given)
    assert created.id == 5 and len(script.requests) == 3
    keys = {r.headers["Idempotency-Key"] for r in script.requests}
    assert len(keys) == 1 and (given is None or keys == {given})
    assert all(r.content == script.requests[0].content for r in script.requests)


def test_two_submits_without_a_key_get_two_keys():
    script = Script([], _created)
    with script.client() as client:
        client.submit([{"type": "echo", "config": {}}])
        client.submit([{"type": "echo", "config": {}}])
    first, second = (r.headers["Idempotency-Key"] for r in script.requests)
    assert first != second


def test_a_cancel_is_idempotent_and_a_pause_is_not():
    build = httpx.Client(base_url="http://farm").build_request
    assert idempotent(build("POST", "/v1/batches/3/cancel"))
    assert idempotent(build("GET", "/v1/batches/3"))
    assert idempotent(build("POST", "/v1/batches", headers={"Idempotency-Key": "k"}))
    assert not idempotent(build("POST", "/v1/batches"))
    assert not idempotent(build("POST", "/v1/weights/pause"))


def test_retries_stop_at_the_total_bound_with_the_last_answers_error():
    script = Script([], lambda r: _unavailable())
    with script.client(RetryPolicy(total_s=0.2, base_s=0.01, max_s=0.02)) as client, pytest.raises(Unavailable):
        client.handlers()
    assert len(script.requests) > 1


def test_no_retries_sends_once():
    script = Script([], lambda r: _unavailable())
    with script.client(NO_RETRIES) as client, pytest.raises(Unavailable):
        client.handlers()
    assert len(script.requests) == 1


def test_waits_are_jittered_under_a_ceiling_that_doubles_up_to_its_cap():
    policy = RetryPolicy(total_s=60, base_s=0.5, max_s=4.0)
    delays = policy.delays(random.Random(3))
    waits = [delays() for _ in range(8)]
    ceilings = [0.5, 1.0, 2.0, 4.0, 4.0, 4.0, 4.0, 4.0]
    assert all(0 <= wait <= ceiling for wait, ceiling in zip(waits, ceilings, strict=True))
    assert len(set(waits)) == len(waits)  # jittered: no two trainers wait in step


class Stream:
    """A finished batch of ``total`` results served by cursor; the first request of each cursor in
    ``failing`` fails with ``failure`` (a restart between pages)."""

    def __init__(self, total: int, failing: set[int], failure: Answer) -> None:
        self.total, self.failing, self.failure = total, set(failing), failure
        self.afters: list[int] = []

    def __call__(self, request: httpx.Request) -> httpx.Response:
        after, limit = int(request.url.params["after"]), int(request.url.params["limit"])
        self.afters.append(after)
        if after in self.failing:
            self.failing.discard(after)
            return self.failure(request)
        seqs = range(after + 1, min(after + limit, self.total) + 1)
        last = seqs[-1] if seqs else after
        return httpx.Response(200, json=_page([_item(s) for s in seqs], last, 0, "complete", finished=self.total))


@pytest.mark.parametrize("failure", [lambda r: _unavailable(), _fail(httpx.ConnectError), _fail(httpx.ReadError)])
def test_results_resumes_from_its_cursor_and_yields_each_job_once(failure):
    stream = Stream(total=50, failing={0, 8, 28}, failure=failure)
    with FarmClient("http://farm", token="t", transport=httpx.MockTransport(stream), retry=QUICK) as client:
        seqs = [r.seq for r in client.results(1, page_size=10, wait_s=0, encoding="json")]
    assert seqs == list(range(1, 51))
    assert stream.afters.count(8) == 2 and stream.afters.count(28) == 2  # each failed page asked for again


def test_async_results_resume_from_the_cursor_and_yield_each_job_once():
    stream = Stream(total=50, failing={0, 18, 38}, failure=_fail(httpx.RemoteProtocolError))

    async def main() -> list[int]:
        transport = httpx.MockTransport(stream)
        async with AsyncFarmClient("http://farm", token="t", transport=transport, retry=QUICK) as client:
            return [r.seq async for r in client.results(1, page_size=10, wait_s=0, encoding="json")]

    assert asyncio.run(main()) == list(range(1, 51))
    assert stream.afters.count(18) == 2


def test_async_client_retries_and_stops_as_the_sync_one_does():
    script = Script([lambda r: _unavailable(), _fail(httpx.ConnectError)], lambda r: httpx.Response(200, json=[]))
    refused = Script([], _fail(httpx.ReadError))

    async def main() -> None:
        async with AsyncFarmClient("http://farm", token="t", transport=httpx.MockTransport(script), retry=QUICK) as c:
            assert await c.handlers() == []
        async with AsyncFarmClient("http://farm", token="t", transport=httpx.MockTransport(refused), retry=QUICK) as c:
            with pytest.raises(httpx.ReadError):
                await c.pause()

    asyncio.run(main())
    assert len(script.requests) == 3 and len(refused.requests) == 1
