"""Built-in CPU backend throughput: generated tokens per second at 1, 4 and 16 concurrent requests.

    python bench/backend.py

Builds the tiny model in a temp dir, starts one built-in backend subprocess (one torch
thread, its default), warms it up, then for each concurrency level keeps that many requests in flight
(64 new tokens each, 32-token prompts, sampled at temperature 1) for ROUNDS rounds. The last line is
JSON with tokens_per_s_c1, tokens_per_s_c4, tokens_per_s_c16.
"""

from __future__ import annotations

import asyncio
import json
import random
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from farm.llm.builtin.testing import BuiltinServer  # noqa: E402
from farm.llm.builtin.tiny import make_tiny  # noqa: E402
from farm.llm.client import VLLMClient  # noqa: E402
from farm.llm.types import GenerateRequest, SamplingParams  # noqa: E402

MAX_TOKENS = 64
PROMPT_TOKENS = 32
ROUNDS = 3
LEVELS = (1, 4, 16)


async def level(client: VLLMClient, concurrency: int, rng: random.Random) -> tuple[float, int]:
    async def one(i: int) -> int:
        prompt = [rng.randrange(10, 500) for _ in range(PROMPT_TOKENS)]
        sampling = SamplingParams(max_tokens=MAX_TOKENS, seed=i)
        result = await client.generate(GenerateRequest(prompt_token_ids=prompt, sampling=sampling))
        return len(result.token_ids)

    start = time.perf_counter()
    tokens = 0
    for r in range(ROUNDS):
        tokens += sum(await asyncio.gather(*(one(r * concurrency + i) for i in range(concurrency))))
    return tokens / (time.perf_counter() - start), tokens


async def bench(url: str) -> dict[str, float]:
    rng = random.Random(0)
    out: dict[str, float] = {}
    async with VLLMClient(base_url=url) as client:
        await level(client, 2, rng)  # warm-up
        for c in LEVELS:
            per_s, tokens = await level(client, c, rng)
            print(f"concurrency {c:2d}: {tokens} tokens, {per_s:.0f} tokens/s")
            out[f"tokens_per_s_c{c}"] = round(per_s, 1)
    return out


def main() -> None:
    with tempfile.TemporaryDirectory() as tmp:
        model_dir = make_tiny(Path(tmp) / "tiny")
        with BuiltinServer(model_dir=model_dir) as server:
            result = asyncio.run(bench(server.url))
    print(json.dumps(result))


if __name__ == "__main__":
    main()
