"""Prefix cache benefit: 8-turn conversations on two built-in backends, sticky vs random routing.

    python bench/prefix.py

Two built-in backend subprocesses on the tiny model. CONVERSATIONS conversations run side by side,
one turn each per round: the prompt is the whole conversation so far (a ~200-token system prompt,
then per turn the sampled reply and a ~120-token tool observation), 8 new tokens per turn.
Sticky routing keeps each conversation on one backend (what the balancer does); random routing
picks a backend per turn. Both modes run on the same two backends, interleaved (REPEATS runs each),
each run on new random content, so a run never finds another run's tokens in the caches.
The last line is JSON: mean per-turn latency and prefix-cache hit rate (cached prompt tokens /
prompt tokens, as the backends report them) for each mode.
"""

from __future__ import annotations

import asyncio
import json
import random
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from farm.llm.builtin.testing import BuiltinServer  # noqa: E402
from farm.llm.builtin.tiny import make_tiny  # noqa: E402
from farm.llm.client import VLLMClient  # noqa: E402
from farm.llm.types import GenerateRequest, SamplingParams  # noqa: E402

CONVERSATIONS = 4
TURNS = 8
SYSTEM_TOKENS = 200
OBSERVATION_TOKENS = 120
NEW_TOKENS = 8
REPEATS = 3


async def run_mode(
    urls: list[str], sticky: bool, seed: int, conversations: int = CONVERSATIONS, turns: int = TURNS
) -> tuple[float, float]:
    rng = random.Random(seed)
    convs = [[rng.randrange(10, 500) for _ in range(SYSTEM_TOKENS)] for _ in range(conversations)]
    turn_ms: list[float] = []
    prompt_tokens = cached_tokens = 0
    clients = [VLLMClient(base_url=u, backend_id=f"b{i}") for i, u in enumerate(urls)]

    async def turn(c: int, t: int) -> None:
        nonlocal prompt_tokens, cached_tokens
        backend = c % len(clients) if sticky else rng.randrange(len(clients))
        request = GenerateRequest(
            prompt_token_ids=convs[c], sampling=SamplingParams(max_tokens=NEW_TOKENS, seed=c * 100 + t)
        )
        start = time.perf_counter()
        result = await clients[backend].generate(request)
        turn_ms.append((time.perf_counter() - start) * 1000)
        prompt_tokens += len(convs[c])
        cached_tokens += result.cached_tokens or 0
        convs[c] = convs[c] + result.token_ids + [rng.randrange(10, 500) for _ in range(OBSERVATION_TOKENS)]

    for t in range(turns):
        await asyncio.gather(*(turn(c, t) for c in range(conversations)))
    for client in clients:
        await client.aclose()
    return statistics.mean(turn_ms), cached_tokens / prompt_tokens


def main() -> None:
    results: dict[bool, list[tuple[float, float]]] = {True: [], False: []}
    with tempfile.TemporaryDirectory() as tmp:
        model_dir = make_tiny(Path(tmp) / "tiny")
        with BuiltinServer(model_dir=model_dir) as a, BuiltinServer(model_dir=model_dir) as b:
            urls = [a.url, b.url]
            # A fresh server's first requests pay torch's one-off costs; warm both up on other content.
            asyncio.run(run_mode(urls, sticky=False, seed=999, conversations=4, turns=4))
            # Interleave the modes so background load on the shared CPU hits both alike. Each run uses
            # new random content, so nothing it sends was cached by an earlier run.
            for rep in range(REPEATS):
                for sticky in (rep % 2 == 0, rep % 2 == 1):
                    results[sticky].append(asyncio.run(run_mode(urls, sticky, seed=rep * 2 + sticky)))
    sticky_ms = statistics.mean(r[0] for r in results[True])
    random_ms = statistics.mean(r[0] for r in results[False])
    sticky_hit = statistics.mean(r[1] for r in results[True])
    random_hit = statistics.mean(r[1] for r in results[False])
    print(f"{CONVERSATIONS} conversations x {TURNS} turns on 2 backends, {REPEATS} runs per mode")
    print(f"sticky: {sticky_ms:.1f} ms/turn, hit rate {sticky_hit:.3f}")
    print(f"random: {random_ms:.1f} ms/turn, hit rate {random_hit:.3f}")
    result = {
        "sticky_turn_ms": round(sticky_ms, 2),
        "random_turn_ms": round(random_ms, 2),
        "sticky_hit_rate": round(sticky_hit, 4),
        "random_hit_rate": round(random_hit, 4),
    }
    print(json.dumps(result))


if __name__ == "__main__":
    main()
