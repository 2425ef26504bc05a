"""The built-in CPU backend over HTTP, exactly as vLLM is used: ids and logprobs are what the model computes."""

from __future__ import annotations

import asyncio
import re
from pathlib import Path

import httpx
import pytest

from farm.errors import UpstreamStatusError
from farm.llm.client import VLLMClient
from farm.llm.trajectory import TrajectoryBuilder
from farm.llm.types import FinishReason, GenerateRequest, SamplingParams

TOLERANCE = 1e-4


def run(coro):
    return asyncio.run(coro)


async def generate(server, prompt, sampling, api="auto", **kwargs):
    async with VLLMClient(base_url=server.url, api=api, **kwargs) as client:
        return await client.generate(GenerateRequest(prompt_token_ids=prompt, sampling=sampling))


def assert_matches_teacher(teacher, prompt, result):
    forced = teacher(prompt + result.token_ids)[len(prompt) :]
    assert len(forced) == len(result.logprobs)
    for got, want in zip(result.logprobs, forced, strict=True):
        assert abs(got - want) <= TOLERANCE


def prompt_of(tokenizer, text):
    messages = [{"role": "user", "content": text}]
    return tokenizer.apply_chat_template(messages, tokenize=True, add_generation_prompt=True, return_dict=False)


@pytest.mark.parametrize("api", ["completions", "generate"])
def test_builtin_token_round_trip(builtin_server, tiny_tokenizer, teacher, api):
    prompt = prompt_of(tiny_tokenizer, f"round trip over {api}")
    result = run(generate(builtin_server, prompt, SamplingParams(max_tokens=24, seed=1), api=api))
    assert 1 <= len(result.token_ids) <= 24
    assert result.finish_reason in (FinishReason.STOP, FinishReason.LENGTH)
    assert result.prompt_tokens == len(prompt)
    assert_matches_teacher(teacher, prompt, result)


def test_builtin_auto_mode_uses_the_generate_endpoint(builtin_server, tiny_tokenizer):
    async def go():
        async with VLLMClient(base_url=builtin_server.url) as client:
            await client.generate(GenerateRequest(prompt_token_ids=prompt_of(tiny_tokenizer, "auto")))
            return client.api

    assert run(go()) == "generate"


def test_builtin_multi_turn_trajectory_matches_teacher_forcing(builtin_server, tiny_tokenizer, teacher):
    builder = TrajectoryBuilder(tokenizer=tiny_tokenizer, messages=[{"role": "user", "content": "list the files"}])
    results = []

    async def conversation():
        async with VLLMClient(base_url=builtin_server.url) as client:
            for turn in range(4):
                request = GenerateRequest(
                    prompt_token_ids=builder.prompt_ids,
                    sampling=SamplingParams(max_tokens=16, temperature=1.0, top_p=0.95, seed=turn),
                )
                result = await client.generate(request)
                results.append(result)
                builder.add_completion(result)
                builder.add_messages([{"role": "tool", "content": f"observation {turn}: a.py b.py"}])

    run(conversation())
    traj = builder.build()
    assert traj.forks == []
    model_spans = [s for s in traj.turns if s.kind == "model"]
    assert [traj.token_ids[s.start : s.end] for s in model_spans] == [r.token_ids for r in results]
    forced = teacher(traj.token_ids)
    for i, mask in enumerate(traj.loss_mask):
        if mask:
            assert abs(traj.logprobs[i] - forced[i]) <= TOLERANCE, f"position {i}"
    # Later turns extend the previous one: the backend served their prefix from its cache.
    assert all(r.cached_tokens and r.cached_tokens > 0 for r in results[1:])


def test_builtin_concurrent_requests_are_each_exact(builtin_server, tiny_tokenizer, teacher):
    prompts = [prompt_of(tiny_tokenizer, f"request {i} " * (i + 1)) for i in range(8)]

    async def all_at_once():
        async with VLLMClient(base_url=builtin_server.url) as client:
            return await asyncio.gather(
                *(
                    client.generate(GenerateRequest(prompt_token_ids=p, sampling=SamplingParams(max_tokens=20, seed=i)))
                    for i, p in enumerate(prompts)
                )
            )

    for prompt, result in zip(prompts, run(all_at_once()), strict=True):
        assert_matches_teacher(teacher, prompt, result)


def test_builtin_same_seed_same_sample(builtin_server, tiny_tokenizer):
    prompt = prompt_of(tiny_tokenizer, "seeded")
    sampling = SamplingParams(max_tokens=20, temperature=1.5, seed=1234)
    first = run(generate(builtin_server, prompt, sampling))
    second = run(generate(builtin_server, prompt, sampling))
    assert first.token_ids == second.token_ids


def test_builtin_temperature_zero_is_greedy(builtin_server, tiny_tokenizer, teacher):
    prompt = prompt_of(tiny_tokenizer, "greedy")
    result = run(generate(builtin_server, prompt, SamplingParams(max_tokens=8, temperature=0.0)))
    best = teacher.argmax(prompt + result.token_ids)
    assert result.token_ids == best[len(prompt) - 1 : len(prompt) - 1 + len(result.token_ids)]


def test_builtin_stops_at_a_stop_token_id(builtin_server, tiny_tokenizer):
    prompt = prompt_of(tiny_tokenizer, "stop early")
    free = run(generate(builtin_server, prompt, SamplingParams(max_tokens=12, temperature=0.0)))
    assert len(free.token_ids) >= 3
    stop_id = free.token_ids[2]
    first = free.token_ids.index(stop_id)
    sampling = SamplingParams(max_tokens=12, temperature=0.0, stop_token_ids=[stop_id])
    stopped = run(generate(builtin_server, prompt, sampling))
    assert stopped.token_ids == free.token_ids[: first + 1]
    assert stopped.finish_reason is FinishReason.STOP


def counter(server, name):
    text = httpx.get(f"{server.url}/metrics").text
    found = re.search(rf"^{name}\{{[^}}]*\}} (\S+)$", text, re.M)
    assert found is not None, text
    return float(found.group(1))


def test_builtin_metrics_count_prefix_cache_hits(builtin_server, tiny_tokenizer):
    prompt = prompt_of(tiny_tokenizer, "metrics " * 20)
    first = run(generate(builtin_server, prompt, SamplingParams(max_tokens=4, seed=0)))
    before = counter(builtin_server, "vllm:prefix_cache_hits_total")
    passes = counter(builtin_server, "farm:forward_passes_total")
    run(generate(builtin_server, prompt + first.token_ids + [5, 6], SamplingParams(max_tokens=4)))
    assert counter(builtin_server, "vllm:prefix_cache_hits_total") - before >= len(prompt)
    # One pass prefills the prompt's new tail and samples the first id; each other id takes one.
    assert counter(builtin_server, "farm:forward_passes_total") - passes == 4


def test_builtin_reset_prefix_cache_prefills_a_seen_prompt_again(builtin_server, tiny_tokenizer):
    prompt = prompt_of(tiny_tokenizer, "reset " * 20)
    first = run(generate(builtin_server, prompt, SamplingParams(max_tokens=4, seed=0)))
    again = prompt + first.token_ids
    assert httpx.post(f"{builtin_server.url}/reset_prefix_cache").status_code == 200
    before = counter(builtin_server, "vllm:prefix_cache_hits_total")
    second = run(generate(builtin_server, again, SamplingParams(max_tokens=4, seed=0)))
    assert second.cached_tokens == 0
    assert counter(builtin_server, "vllm:prefix_cache_hits_total") == before


def test_builtin_unknown_model_is_a_clear_404(builtin_server, tiny_tokenizer):
    with pytest.raises(UpstreamStatusError, match="does not exist") as info:
        run(generate(builtin_server, prompt_of(tiny_tokenizer, "x"), SamplingParams(), model="no-such-model"))
    assert info.value.status == 404


@pytest.mark.parametrize("api", ["completions", "generate"])
def test_builtin_rejects_out_of_vocabulary_ids(builtin_server, api):
    with pytest.raises(UpstreamStatusError, match="out of vocabulary") as info:
        run(generate(builtin_server, [1, 10**6], SamplingParams(), api=api))
    assert info.value.status == 400


def test_builtin_rejects_a_prompt_that_fills_the_context(builtin_server):
    with pytest.raises(UpstreamStatusError, match="maximum context length") as info:
        run(generate(builtin_server, [5] * 2048, SamplingParams(max_tokens=16)))
    assert info.value.status == 400


def test_builtin_clamps_max_tokens_to_the_context_left(builtin_server):
    result = run(generate(builtin_server, [5] * 2044, SamplingParams(max_tokens=16, temperature=0.0)))
    assert 1 <= len(result.token_ids) <= 4


def test_make_tiny_context_sets_what_the_backend_serves(tmp_path: Path) -> None:
    from farm.llm.builtin.engine import Engine
    from farm.llm.builtin.tiny import make_tiny

    model = make_tiny(tmp_path / "long", context=8192)
    engine = Engine(model_dir=model)
    engine.start()
    try:
        # A prompt longer than the default 2048 positions is served, and its logprobs are finite.
        out = engine.submit([7] * 5000, SamplingParams(max_tokens=4, seed=0)).result(timeout=120)
    finally:
        engine.stop()
    assert engine.max_model_len == 8192
    assert len(out.token_ids) == 4 and all(lp <= 0.0 for lp in out.logprobs)


def assert_top_matches_teacher(teacher, prompt, result, k):
    """Each position's top k are the model's k most likely tokens, most likely first, and the
    sampled token's logprob is at most the first's (and among them when it is in the top k)."""
    want = teacher.top(prompt + result.token_ids, k)[len(prompt) - 1 : -1]
    assert result.top_logprobs is not None and len(result.top_logprobs) == len(result.token_ids)
    for tok, lp, got, expect in zip(result.token_ids, result.logprobs, result.top_logprobs, want, strict=True):
        assert list(got) == list(expect)
        assert all(abs(got[t] - expect[t]) <= TOLERANCE for t in expect)
        values = list(got.values())
        assert values == sorted(values, reverse=True)
        assert lp <= values[0] + TOLERANCE
        if tok in got:
            assert abs(got[tok] - lp) <= TOLERANCE


@pytest.mark.parametrize("api", ["completions", "generate"])
@pytest.mark.parametrize("stream", [False, True])
def test_builtin_top_logprobs_are_the_models_k_most_likely(builtin_server, tiny_tokenizer, teacher, api, stream):
    k = 5
    request = GenerateRequest(
        prompt_token_ids=prompt_of(tiny_tokenizer, f"top logprobs over {api}"),
        sampling=SamplingParams(max_tokens=24, seed=4),
        top_logprobs=k,
    )

    async def go():
        async with VLLMClient(base_url=builtin_server.url, api=api) as client:
            if not stream:
                return await client.generate(request)
            items = [item async for item in client.generate_stream(request)]
            assert [m for d in items[:-1] for m in d.top_logprobs or []] == items[-1].top_logprobs
            return items[-1]

    result = run(go())
    assert_top_matches_teacher(teacher, request.prompt_token_ids, result, k)
    # Sampled at temperature 1 from a random model, some ids come from outside the top k.
    assert any(tok not in top for tok, top in zip(result.token_ids, result.top_logprobs, strict=True))
