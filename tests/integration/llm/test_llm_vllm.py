"""Against real vLLM on CPU (opt-in: ``--run-vllm``; build the environment with ``scripts/setup_vllm.sh``).

The same checks as for the built-in backend: the farm's client gets the sampled ids and logprobs
that a teacher-forced recompute of the tiny model gives, over both vLLM endpoints.
"""

from __future__ import annotations

import asyncio
import time

import httpx
import pytest

from farm.llm.builtin.tiny import make_tiny
from farm.llm.client import VLLMClient
from farm.llm.control import BackendControl
from farm.llm.trajectory import TrajectoryBuilder
from farm.llm.types import GenerateRequest, GenerateResult, SamplingParams, StreamDelta
from tests.conftest import teacher_for
from tests.integration.llm.conftest import running_vllm

pytestmark = [pytest.mark.vllm, pytest.mark.timeout(900)]

TOLERANCE = 1e-4


@pytest.fixture(scope="module")
def vllm_server(tiny_model_dir, tmp_path_factory):
    with running_vllm(tiny_model_dir, name="farm-tiny", tmp_path_factory=tmp_path_factory) as url:
        yield url


def prompt_of(tokenizer, text):
    messages = [{"role": "user", "content": text}]
    return tokenizer.apply_chat_template(messages, tokenize=True, add_generation_prompt=True, return_dict=False)


async def generate(url, prompt, sampling, api):
    async with VLLMClient(base_url=url, api=api) as client:
        return await client.generate(GenerateRequest(prompt_token_ids=prompt, sampling=sampling))


@pytest.mark.parametrize("api", ["completions", "generate"])
def test_vllm_token_round_trip_matches_teacher_forcing(vllm_server, tiny_tokenizer, teacher, api):
    prompt = prompt_of(tiny_tokenizer, f"vllm round trip {api}")
    result = asyncio.run(generate(vllm_server, prompt, SamplingParams(max_tokens=24, seed=3), api))
    assert 1 <= len(result.token_ids) <= 24
    forced = teacher(prompt + result.token_ids)[len(prompt) :]
    for got, want in zip(result.logprobs, forced, strict=True):
        assert abs(got - want) <= TOLERANCE


def test_vllm_multi_turn_trajectory_matches_teacher_forcing(vllm_server, tiny_tokenizer, teacher):
    builder = TrajectoryBuilder(tokenizer=tiny_tokenizer, messages=[{"role": "user", "content": "run the tests"}])

    async def conversation():
        async with VLLMClient(base_url=vllm_server) as client:
            for turn in range(3):
                sampling = SamplingParams(max_tokens=12, top_p=0.9, seed=turn)
                result = await client.generate(GenerateRequest(prompt_token_ids=builder.prompt_ids, sampling=sampling))
                builder.add_completion(result)
                builder.add_messages([{"role": "tool", "content": f"{turn} passed"}])

    asyncio.run(conversation())
    traj = builder.build()
    forced = teacher(traj.token_ids)
    assert sum(traj.loss_mask) > 0
    for i, mask in enumerate(traj.loss_mask):
        if mask:
            assert abs(traj.logprobs[i] - forced[i]) <= TOLERANCE, f"position {i}"


def test_vllm_pause_keep_resume_labels_tokens_with_the_new_version(vllm_server, tiny_tokenizer):
    with httpx.Client(timeout=120) as http:
        control = BackendControl(http, backend_id="vllm", url=vllm_server, kind="vllm")
        control.pause("keep")
        assert control.is_paused() is True
        control.set_version(3)
        control.resume()
        assert control.is_paused() is False
    prompt = prompt_of(tiny_tokenizer, "labelled by version")
    result = asyncio.run(generate(vllm_server, prompt, SamplingParams(max_tokens=8, seed=1), "generate"))
    assert result.weight_versions == [(3, 0, len(result.token_ids))]


async def running_requests(http: httpx.AsyncClient) -> float:
    """The engine's ``vllm:num_requests_running`` gauge."""
    text = (await http.get("/metrics")).text
    lines = [line for line in text.splitlines() if line.startswith("vllm:num_requests_running")]
    return sum(float(line.rsplit(" ", 1)[1]) for line in lines)


def test_vllm_pause_abort_answers_the_turns_in_flight_with_finish_reason_abort(vllm_server, tiny_tokenizer):
    prompt = prompt_of(tiny_tokenizer, "a long answer please")
    body = {"model": "farm-tiny", "prompt": prompt, "max_tokens": 900, "ignore_eos": True, "logprobs": 0}
    body |= {"return_token_ids": True}

    async def go() -> list[dict]:
        async with httpx.AsyncClient(base_url=vllm_server, timeout=300) as http:
            # Eight long turns, paused once the engine runs them: a pause that lands before a turn
            # reaches the engine only queues it (a loaded machine took more than 0.3 s to get there).
            turns = [asyncio.create_task(http.post("/v1/completions", json=body)) for _ in range(8)]
            deadline = time.monotonic() + 120
            while await running_requests(http) < 1:
                assert time.monotonic() < deadline, "vLLM never ran the turns"
                await asyncio.sleep(0.02)
            await http.post("/pause", params={"mode": "abort"})
            answers = [(await turn).json() for turn in turns]
            await http.post("/resume")
            return [a["choices"][0] for a in answers]

    choices = asyncio.run(go())
    aborted = [c for c in choices if c["finish_reason"] == "abort"]
    assert aborted, [c["finish_reason"] for c in choices]
    assert all(len(c["token_ids"]) < 900 for c in aborted)


def test_vllm_reloads_weights_from_a_directory(vllm_server, tiny_model_dir, tiny_tokenizer, tmp_path):
    other = make_tiny(tmp_path / "seed1", seed=1)
    prompt = prompt_of(tiny_tokenizer, "new weights")
    with httpx.Client(timeout=300) as http:
        control = BackendControl(http, backend_id="vllm", url=vllm_server, kind="vllm")
        control.pause("wait")
        control.load(str(other), 4)
        control.set_version(4)
        control.resume()
        try:
            result = asyncio.run(generate(vllm_server, prompt, SamplingParams(max_tokens=12, seed=2), "generate"))
            want = teacher_for(other)(prompt + result.token_ids)[len(prompt) :]
            assert max(abs(a - b) for a, b in zip(result.logprobs, want, strict=True)) <= TOLERANCE
            assert result.weight_versions == [(4, 0, len(result.token_ids))]
        finally:
            control.pause("wait")
            control.load(str(tiny_model_dir), 0)
            control.set_version(0)
            control.resume()


@pytest.mark.parametrize("api", ["generate", "completions"])
def test_vllm_stream_gives_the_same_result_as_a_whole_answer(vllm_server, tiny_tokenizer, api):
    request = GenerateRequest(
        prompt_token_ids=prompt_of(tiny_tokenizer, f"streamed over {api}"),
        sampling=SamplingParams(max_tokens=48, seed=9),
    )

    async def go():
        async with VLLMClient(base_url=vllm_server, api=api) as client:
            whole = await client.generate(request)
            items = [item async for item in client.generate_stream(request)]
            return whole, items

    whole, items = asyncio.run(go())
    *deltas, final = items
    assert all(isinstance(d, StreamDelta) for d in deltas) and isinstance(final, GenerateResult)
    assert [t for d in deltas for t in d.token_ids] == final.token_ids == whole.token_ids
    assert max(abs(a - b) for a, b in zip(final.logprobs, whole.logprobs, strict=True)) <= TOLERANCE
    assert final.finish_reason == whole.finish_reason
    if api == "generate":
        assert final.weight_versions == whole.weight_versions


@pytest.mark.parametrize("api", ["completions", "generate"])
def test_vllm_top_logprobs_are_the_models_k_most_likely(vllm_server, tiny_tokenizer, teacher, api):
    k = 5
    request = GenerateRequest(
        prompt_token_ids=prompt_of(tiny_tokenizer, f"top logprobs over {api}"),
        sampling=SamplingParams(max_tokens=16, seed=4),
        top_logprobs=k,
    )

    async def go():
        async with VLLMClient(base_url=vllm_server, api=api) as client:
            whole = await client.generate(request)
            items = [item async for item in client.generate_stream(request)]
            return whole, items[-1]

    for result in asyncio.run(go()):
        prompt = request.prompt_token_ids
        want = teacher.top(prompt + result.token_ids, k)[len(prompt) - 1 : -1]
        assert result.top_logprobs is not None and len(result.top_logprobs) == len(result.token_ids)
        for got, expect in zip(result.top_logprobs, want, strict=True):
            assert set(got) == set(expect)
            assert max(abs(got[t] - expect[t]) for t in expect) <= TOLERANCE
            assert list(got.values()) == sorted(got.values(), reverse=True)
