"""The proxy's cost: the same conversations through ``farm proxy`` and straight to the backend.

    python bench/proxy.py [--trials 32] [--turns 4] [--max-tokens 32] [--rounds 6] [--processes 1] [--step-ms 0]

A farm (API, a ``farm proxy`` process, the built-in backend on the tiny model; no workers) on a
fresh PostgreSQL database. Each round runs ``--trials`` concurrent trials of ``--turns`` turns
through the proxy's Chat Completions route (each turn: the history, the reply, a new user message),
with a plain httpx client on the transport the direct side's client uses (the openai SDK adds
~35 ms of its own per call here, which is the harness's cost, not the proxy's: ``ttft_sdk_ms``
shows it), then
replays every call's exact prompt ids straight to the backend (``/v1/completions``, the same seed,
so the same tokens are sampled), turn by turn, ``--trials`` at a time. Proxy and direct rounds
alternate, so drift in the machine's speed hits both. Per-request p50 and p99 of each over all
rounds; ``overhead_ratio`` is the median over rounds of a round's proxy p50 over its direct p50
(target: at most 1.10, or 2 ms more): one round is ~4 s, and this machine's speed drifts between them.
With the tiny model on a CPU, the backend's work per call (~9 ms of CPU) is not much more than the
proxy's own (~4 ms, and ~1 ms of PostgreSQL's: ``postgres_cpu_ms_per_call``), and on a small machine
they share the cores: the default ratio measures that contention.
``--step-ms 25`` gives the backend a served model's pace (each decode step lasts 25 ms, waited, not
computed): the proxy's overhead as a node with a GPU backend sees it. ``--pin`` (Linux) keeps the
tiny model's pace but gives the backend a core of its own (every other process of the farm, the
bench and the PostgreSQL connections serving it get the other cores): what is left of the overhead
then is the proxy's own latency, not its CPU taken from the backend.

Time to first token, one request at a time (a 256-token answer, median of 15): streamed through the proxy
(``ttft_stream_ms``, to the first content chunk; ``ttft_sdk_ms`` the same read by the openai SDK) and
not streamed (``ttft_nostream_ms``, the whole answer). Its floor is one prefill plus one decode step,
measured straight at the backend as a ``max_tokens=2`` request on a prompt as long as the proxy's and
new to the backend's prefix cache (``prefill_decode_ms``); target
``ttft_ratio`` = ttft_stream / floor <= 1.5.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import psutil
from sqlalchemy.engine import make_url

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench._common import emit, flushed_redis, free_port, fresh_database, stack_settings  # noqa: E402
from farm.api.metrics import sum_samples  # noqa: E402
from farm.embedded import EmbeddedStack  # noqa: E402
from farm.llm.client import KEEPALIVE_EXPIRY_S, VLLMClient  # noqa: E402
from farm.llm.transport import LeanTransport  # noqa: E402
from farm.llm.types import GenerateRequest, SamplingParams  # noqa: E402

#: the floor's prompts draw from these ids (ordinary tokens of the tiny model's vocabulary).
FLOOR_IDS = (100, 500)
WORDS = "alpha beta gamma delta epsilon zeta eta theta iota kappa lambda".split()


def pin(stack: EmbeddedStack, db_name: str) -> None:
    """The backend's threads on the first core; the farm's other processes (with their children),
    this one and the PostgreSQL backends serving ``db_name`` on the rest. Threads started later
    inherit their creator's cores."""
    cores = sorted(os.sched_getaffinity(0))
    if len(cores) < 2:
        raise SystemExit("--pin needs at least 2 cores")
    own, rest = {cores[0]}, set(cores[1:])
    placed: list[tuple[psutil.Process, set[int]]] = [(psutil.Process(), rest)]
    for service in stack.services:
        process = psutil.Process(service.process.pid)
        for p in [process, *process.children(recursive=True)]:
            placed.append((p, own if service.name == "llm" else rest))
    for p in psutil.process_iter(["cmdline"]):
        if p.info["cmdline"] and db_name in " ".join(p.info["cmdline"]):
            placed.append((p, rest))
    for p, where in placed:
        for thread in p.threads():
            with contextlib.suppress(OSError):
                os.sched_setaffinity(thread.id, where)


def cpu_of(process: psutil.Process) -> float:
    """User and system CPU seconds of a process and its children (``--processes`` > 1 forks them)."""
    return sum(sum(p.cpu_times()[:2]) for p in [process, *process.children(recursive=True)])


class ServiceCpu:
    """CPU seconds of PostgreSQL's and Redis's server processes (the whole cluster: its WAL writer
    flushes the proxy's commits), for what a proxied call costs beyond the proxy process itself."""

    NAMES = {"postgres": "postgres", "redis-server": "redis"}

    def __init__(self) -> None:
        self.seen: dict[int, tuple[str, float]] = {}

    def take(self) -> dict[str, float]:
        """Seconds each service used since the last take (a process new since then: all of its)."""
        used = dict.fromkeys(self.NAMES.values(), 0.0)
        now: dict[int, tuple[str, float]] = {}
        for p in psutil.process_iter(["name", "cpu_times"]):
            service = self.NAMES.get(p.info["name"] or "")
            if service is None or p.info["cpu_times"] is None:
                continue
            total = sum(p.info["cpu_times"][:2])
            now[p.pid] = (service, total)
            used[service] += total - self.seen.get(p.pid, (service, 0.0))[1]
        self.seen = now
        return used


def lean_client(connections: int) -> httpx.AsyncClient:
    """The bench's own client to the proxy: the transport the direct side's ``VLLMClient`` uses, so
    both sides pay the same client cost (httpx's default costs ~1 ms more CPU per request here)."""
    transport = LeanTransport(max_connections=connections, keepalive_expiry=KEEPALIVE_EXPIRY_S)
    return httpx.AsyncClient(timeout=120, transport=transport)


async def backend_work(http: httpx.AsyncClient, backend_url: str) -> dict[str, int]:
    """The built-in backend's work so far: prompt tokens computed (not read from its prefix cache)
    and forward passes."""
    names = ("vllm:prompt_tokens_total", "vllm:prefix_cache_hits_total", "farm:forward_passes_total")
    counters = sum_samples((await http.get(f"{backend_url}/metrics")).text.splitlines(), names)
    return {
        "prefill_tokens": int(counters["vllm:prompt_tokens_total"] - counters["vllm:prefix_cache_hits_total"]),
        "forward_passes": int(counters["farm:forward_passes_total"]),
    }


def pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


async def proxy_round(
    api: httpx.AsyncClient,
    proxy_url: str,
    trials: int,
    turns: int,
    max_tokens: int,
    tag: str,
    ready: Callable[[], object] = lambda: None,
) -> tuple[list[float], list[str]]:
    """``ready`` is called once the trials exist, before their first calls."""
    latencies: list[float] = []
    http = lean_client(trials)

    async def one(i: int, made: dict[str, Any]) -> None:
        url = f"{proxy_url}/proxy/{made['id']}/v1/chat/completions"
        headers = {"Authorization": f"Bearer {made['key']}"}
        messages: list[Any] = [{"role": "user", "content": f"{tag} {WORDS[i % len(WORDS)]} {i}"}]
        for turn in range(turns):
            body = {"model": "farm-tiny", "messages": messages, "max_tokens": max_tokens, "temperature": 1.0}
            start = time.perf_counter()
            out = await http.post(url, json=body, headers=headers)
            latencies.append(time.perf_counter() - start)
            if out.status_code != 200:
                why = f"the proxy answered {out.status_code}: {out.text[:400]}"
                raise SystemExit(f"turn {turn} of trial {made['id']}: {why}")
            reply = out.json()["choices"][0]["message"]
            messages += [
                {k: v for k, v in reply.items() if v is not None},
                {"role": "user", "content": f"{WORDS[turn % len(WORDS)]} again"},
            ]

    # Every trial exists before the first call, so the calls start together as the direct side's do
    # (trials created along the way staggered them by the API's time per trial).
    made = [(await api.post("/v1/trials", json={"sampling": {"seed": i}})).json() for i in range(trials)]
    ids = [m["id"] for m in made]
    ready()
    async with http:
        await asyncio.gather(*(one(i, m) for i, m in enumerate(made)))
    return latencies, ids


async def prompts_of(api: httpx.AsyncClient, trial_ids: list[str]) -> list[list[tuple[list[int], int]]]:
    """Per trial, each call's prompt ids and seed, from the record (what the backend was sent)."""
    out = []
    for i, trial_id in enumerate(trial_ids):
        record = (await api.get(f"/v1/trials/{trial_id}/record")).json()
        (segment,) = record["segment_tokens"]
        ids = segment["token_ids"]
        calls = []
        for entry in record["certificate"]:
            calls.append((ids[: entry["prompt_tokens"]], i))
        out.append(calls)
    return out


async def direct_round(backend: VLLMClient, prompts: list[list[tuple[list[int], int]]], max_tokens: int) -> list[float]:
    latencies: list[float] = []

    async def one(calls: list[tuple[list[int], int]]) -> None:
        for prompt, seed in calls:
            sampling = SamplingParams(max_tokens=max_tokens, seed=seed, temperature=1.0)
            start = time.perf_counter()
            await backend.generate(GenerateRequest(prompt_token_ids=prompt, sampling=sampling))
            latencies.append(time.perf_counter() - start)

    await asyncio.gather(*(one(calls) for calls in prompts))
    return latencies


async def ttft(api: httpx.AsyncClient, proxy_url: str, backend: VLLMClient, repeats: int = 15) -> dict[str, float]:
    import openai

    made = (await api.post("/v1/trials", json={"sampling": {"seed": 3}})).json()
    base = f"{proxy_url}/proxy/{made['id']}/v1"
    headers = {"Authorization": f"Bearer {made['key']}"}
    stream_s, sdk_s, whole_s, floor_s = [], [], [], []
    async with (
        openai.AsyncOpenAI(base_url=base, api_key=made["key"], max_retries=0) as client,
        lean_client(1) as http,
    ):
        # The floor's prompts are as long as the proxy's and new to the backend's prefix cache each
        # time (a prompt it has seen costs no prefill: the floor would be one decode step alone).
        body = {"model": "farm-tiny", "messages": [{"role": "user", "content": "a long story 0"}], "max_tokens": 1}
        await http.post(f"{base}/chat/completions", json=body, headers=headers)
        record = (await api.get(f"/v1/trials/{made['id']}/record")).json()
        prompt_tokens = record["certificate"][0]["prompt_tokens"]
        for r in range(repeats):
            messages: list[Any] = [{"role": "user", "content": f"a long story {r}"}]
            body = {"model": "farm-tiny", "messages": messages, "max_tokens": 256, "stream": True}
            start = time.perf_counter()
            first = None
            async with http.stream("POST", f"{base}/chat/completions", json=body, headers=headers) as response:
                async for line in response.aiter_lines():
                    if first is None and line.startswith("data: {") and '"content":"' in line.replace(" ", ""):
                        if '"content":""' not in line.replace(" ", ""):
                            first = time.perf_counter() - start
            stream_s.append(first if first is not None else time.perf_counter() - start)
            start = time.perf_counter()
            stream = await client.chat.completions.create(
                model="farm-tiny", messages=messages, max_tokens=256, stream=True
            )  # an AsyncStream: stream=True
            first = None
            async for chunk in stream:
                if first is None and chunk.choices and chunk.choices[0].delta.content:
                    first = time.perf_counter() - start
            sdk_s.append(first if first is not None else time.perf_counter() - start)
            start = time.perf_counter()
            await client.chat.completions.create(model="farm-tiny", messages=messages, max_tokens=256)
            whole_s.append(time.perf_counter() - start)
            prompt = [FLOOR_IDS[0] + (r * 31 + k * 17) % (FLOOR_IDS[1] - FLOOR_IDS[0]) for k in range(prompt_tokens)]
            start = time.perf_counter()
            await backend.generate(GenerateRequest(prompt_token_ids=prompt, sampling=SamplingParams(max_tokens=2)))
            floor_s.append(time.perf_counter() - start)
    stream_ms, floor_ms = statistics.median(stream_s) * 1000, statistics.median(floor_s) * 1000
    return {
        "ttft_stream_ms": round(stream_ms, 2),
        "ttft_sdk_ms": round(statistics.median(sdk_s) * 1000, 2),
        "ttft_nostream_ms": round(statistics.median(whole_s) * 1000, 2),
        "prefill_decode_ms": round(floor_ms, 2),
        "ttft_ratio": round(stream_ms / floor_ms, 3),
    }


async def run(stack: EmbeddedStack, proxy_url: str, args: argparse.Namespace) -> dict[str, Any]:
    token = stack.settings.api.token
    assert token is not None
    headers = {"Authorization": f"Bearer {token.get_secret_value()}"}
    async with (
        httpx.AsyncClient(base_url=stack.settings.api_url, headers=headers, timeout=120) as api,
        VLLMClient(base_url=stack.builtin_url) as backend,
    ):
        await proxy_round(api, proxy_url, 2, 1, 4, "warm")
        proxy_all: list[float] = []
        direct_all: list[float] = []
        ratios: list[float] = []
        proxy_process = psutil.Process(next(s.process.pid for s in stack.services if s.name == "proxy"))
        cpu_s = 0.0
        services = ServiceCpu()
        service_s = dict.fromkeys(ServiceCpu.NAMES.values(), 0.0)
        work = {(side, what): 0 for side in ("proxy", "direct") for what in ("prefill_tokens", "forward_passes")}

        async def count(side: str, since: dict[str, int]) -> None:
            for what, n in (await backend_work(api, stack.builtin_url)).items():
                work[side, what] += n - since[what]

        for r in range(args.rounds):
            before = cpu_of(proxy_process)
            since = await backend_work(api, stack.builtin_url)
            latencies, ids = await proxy_round(
                api, proxy_url, args.trials, args.turns, args.max_tokens, f"r{r}", ready=services.take
            )
            cpu_s += cpu_of(proxy_process) - before
            for name, used in services.take().items():
                service_s[name] += used
            await count("proxy", since)
            prompts = await prompts_of(api, ids)
            # The direct side replays the proxy's prompts: from a backend that keeps them, it would
            # prefill nothing. Emptied, it prefills what the proxy's calls did (each turn's new tail).
            await api.post(f"{stack.builtin_url}/reset_prefix_cache")
            since = await backend_work(api, stack.builtin_url)
            direct = await direct_round(backend, prompts, args.max_tokens)
            await count("direct", since)
            ratios.append(pct(latencies, 0.5) / pct(direct, 0.5))
            print(
                f"round {r}: proxy p50 {pct(latencies, 0.5) * 1000:.1f} ms, direct p50 {pct(direct, 0.5) * 1000:.1f} ms"
            )
            proxy_all += latencies
            direct_all += direct
        figures: dict[str, Any] = {
            "proxy_p50_ms": round(pct(proxy_all, 0.5) * 1000, 2),
            "proxy_p99_ms": round(pct(proxy_all, 0.99) * 1000, 2),
            "direct_p50_ms": round(pct(direct_all, 0.5) * 1000, 2),
            "direct_p99_ms": round(pct(direct_all, 0.99) * 1000, 2),
        }
        figures["overhead_ratio"] = round(statistics.median(ratios), 3)
        figures["overhead_ratio_rounds"] = [round(r, 3) for r in ratios]
        figures["overhead_ms"] = round(figures["proxy_p50_ms"] - figures["direct_p50_ms"], 2)
        # The proxy's own CPU per call: on a machine whose cores the backend saturates, what it costs.
        figures["proxy_cpu_ms_per_call"] = round(cpu_s * 1000 / len(proxy_all), 2)
        # The backend's work per call on each side: prompt tokens computed (equal on both: a fair
        # comparison) and forward passes (more when calls arrive spread out).
        for (side, what), n in work.items():
            figures[f"{side}_{what}_per_call"] = round(n / len(proxy_all), 2)
        # What the calls' records and balancing cost the servers.
        for name, used in service_s.items():
            figures[f"{name}_cpu_ms_per_call"] = round(used * 1000 / len(proxy_all), 2)
        figures.update(await ttft(api, proxy_url, backend))
        return figures


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--trials", type=int, default=32)
    parser.add_argument("--turns", type=int, default=4)
    parser.add_argument("--max-tokens", type=int, default=32)
    parser.add_argument("--rounds", type=int, default=6)
    parser.add_argument("--processes", type=int, default=1, help="farm proxy --processes")
    parser.add_argument(
        "--step-ms",
        type=float,
        default=0.0,
        help="each decode step of the backend lasts at least this long (a bigger model's pace, without its CPU)",
    )
    parser.add_argument("--pin", action="store_true", help="the backend on a core of its own (Linux)")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp, fresh_database() as db_url, flushed_redis() as redis_url:
        settings = stack_settings(Path(tmp), redis_url=redis_url, database_url=db_url, concurrency={})
        llm = settings.llm.model_copy(update={"builtin_step_time_ms": args.step_ms})
        settings = settings.model_copy(update={"llm": llm})
        stack = EmbeddedStack(settings, with_flower=False, with_llm=True, stages=())
        stack.start()
        try:
            port = free_port()
            stack.spawn("proxy", ["proxy", "--port", str(port), "--processes", str(args.processes)])
            proxy_url = f"http://127.0.0.1:{port}"
            deadline = time.monotonic() + 60
            while time.monotonic() < deadline:
                try:
                    if httpx.get(f"{proxy_url}/health", timeout=1).status_code == 200:
                        break
                except httpx.HTTPError:
                    time.sleep(0.2)
            if args.pin:
                pin(stack, make_url(db_url).database or "")
            figures = asyncio.run(run(stack, proxy_url, args))
        finally:
            stack.stop()
    emit(
        {
            "trials": args.trials,
            "turns": args.turns,
            "max_tokens": args.max_tokens,
            "proxy_processes": args.processes,
            "step_ms": args.step_ms,
            "pinned": args.pin,
            **figures,
        }
    )


if __name__ == "__main__":
    main()
