"""The built-in backend's weight-update routes over HTTP, as vLLM 0.32 serves them: pause in each mode
with a turn decoding, resume on a new version label, load new weights from a directory.

The backend decodes one step per 20 ms (``--step-time-ms``) and answers a marked prompt with a long
scripted reply, so a turn is still decoding when the test acts on it."""

from __future__ import annotations

import asyncio
import re
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from farm.llm.builtin.testing import BuiltinServer
from farm.llm.builtin.tiny import make_tiny
from farm.llm.client import VLLMClient
from farm.llm.types import FinishReason, GenerateRequest, GenerateResult, SamplingParams
from tests.conftest import teacher_for

pytestmark = [pytest.mark.integration, pytest.mark.timeout(180)]

#: ~190 tokens of the tiny model: ~3.8 s of decoding, seconds after the tests act on the turn.
LONG = "one two three four five six seven eight nine ten " * 6
SCRIPT = {"rules": [{"match": "say it long", "turns": [LONG]}]}
STEP_MS = 20


@pytest.fixture(scope="module")
def server(tiny_model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[BuiltinServer]:
    log = tmp_path_factory.mktemp("logs") / "weights-backend.log"
    with BuiltinServer(model_dir=tiny_model_dir, log_path=log, script=SCRIPT, step_time_ms=STEP_MS) as srv:
        yield srv


@pytest.fixture
def backend(server: BuiltinServer) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=server.url, timeout=60) as http:
        yield http
        # Whatever a test did, the next one finds it serving the seed-0 weights.
        http.post("/resume")
        http.post("/update_weight_version", json={"new_version": "0"})


def prompt_of(tokenizer, text: str) -> list[int]:
    messages = [{"role": "user", "content": text}]
    return list(tokenizer.apply_chat_template(messages, tokenize=True, add_generation_prompt=True, return_dict=False))


def generated(http: httpx.Client) -> int:
    text = http.get("/metrics").text
    found = re.search(r"^vllm:generation_tokens_total\S* (\S+)$", text, re.M)
    assert found is not None, "the backend's /metrics has no generation_tokens_total"
    return int(float(found.group(1)))


async def wait_for_tokens(http: httpx.Client, at_least: int) -> int:
    """Wait until the backend has decoded ``at_least`` more tokens than when called; returns the count."""
    start = generated(http)
    deadline = time.monotonic() + 30
    while (now := generated(http)) - start < at_least:
        assert time.monotonic() < deadline, "the backend decoded nothing"
        await asyncio.sleep(0.02)
    return now


async def long_turn(
    server: BuiltinServer, tokenizer, tag: str = "say it long", max_tokens: int = 500
) -> GenerateResult:
    async with VLLMClient(base_url=server.url, api="generate") as client:
        request = GenerateRequest(
            prompt_token_ids=prompt_of(tokenizer, tag), sampling=SamplingParams(max_tokens=max_tokens)
        )
        return await client.generate(request)


def test_pause_keep_freezes_the_turn_and_it_ends_on_the_new_version(server, backend, tiny_tokenizer):
    async def go() -> tuple[GenerateResult, int, int]:
        turn = asyncio.create_task(long_turn(server, tiny_tokenizer))
        await wait_for_tokens(backend, 10)
        assert backend.post("/pause", params={"mode": "keep"}).json() == {"status": "paused"}
        assert backend.get("/is_paused").json() == {"is_paused": True}
        frozen = generated(backend)
        await asyncio.sleep(10 * STEP_MS / 1000)
        still = generated(backend)
        assert backend.post("/update_weight_version", json={"new_version": "7"}).status_code == 200
        assert backend.post("/resume").json() == {"status": "resumed"}
        return await turn, frozen, still

    result, frozen, still = asyncio.run(go())

    assert still == frozen, "nothing decodes while paused in keep mode"
    assert result.finish_reason is FinishReason.STOP
    (v0, s0, e0), (v1, s1, e1) = result.weight_versions
    assert (v0, s0, v1, e1) == (0, 0, 7, len(result.token_ids)) and e0 == s1
    assert 10 <= e0 < len(result.token_ids), "the tokens before the pause are version 0, the rest version 7"
    assert backend.get("/weight_info").json() == {"weight_version": "7"}


def test_pause_abort_ends_the_turn_and_holds_new_ones_until_resume(server, backend, tiny_tokenizer):
    async def go() -> tuple[GenerateResult, GenerateResult, bool]:
        turn = asyncio.create_task(long_turn(server, tiny_tokenizer))
        await wait_for_tokens(backend, 5)
        backend.post("/pause", params={"mode": "abort"})
        aborted = await turn
        later = asyncio.create_task(long_turn(server, tiny_tokenizer, "short please", max_tokens=8))
        await asyncio.sleep(0.3)
        held = not later.done()
        backend.post("/resume")
        return aborted, await later, held

    aborted, later, held = asyncio.run(go())

    assert aborted.finish_reason is FinishReason.ABORT
    assert 5 <= len(aborted.token_ids) < len(tiny_tokenizer.encode(LONG, add_special_tokens=False))
    assert aborted.weight_versions == [(0, 0, len(aborted.token_ids))]
    assert held, "a turn sent while paused waits in the queue"
    assert later.finish_reason in (FinishReason.STOP, FinishReason.LENGTH)


def test_pause_wait_lets_the_turn_finish_and_holds_the_next(server, backend, tiny_tokenizer):
    async def go() -> tuple[GenerateResult, int, int, bool]:
        turn = asyncio.create_task(long_turn(server, tiny_tokenizer))
        await wait_for_tokens(backend, 5)
        paused = await asyncio.to_thread(backend.post, "/pause", params={"mode": "wait"})
        assert paused.status_code == 200
        at_pause = generated(backend)
        # Not frozen: its answer comes without a resume.
        result = await asyncio.wait_for(turn, timeout=10)
        later = asyncio.create_task(long_turn(server, tiny_tokenizer, "short please", max_tokens=8))
        await asyncio.sleep(0.3)
        held = not later.done()
        after = generated(backend)
        backend.post("/resume")
        await later
        return result, at_pause, after, held

    result, at_pause, after, held = asyncio.run(go())

    assert result.finish_reason is FinishReason.STOP
    assert len(result.token_ids) == len(tiny_tokenizer.encode(LONG, add_special_tokens=False)) + 1
    assert result.weight_versions == [(0, 0, len(result.token_ids))]
    assert after == at_pause and held, "after a wait-pause nothing decodes until resume"


def test_reload_weights_serves_the_new_model(server, backend, tiny_tokenizer, teacher, tmp_path):
    other = make_tiny(tmp_path / "seed1", seed=1)
    prompt = prompt_of(tiny_tokenizer, "a question for the new weights")

    async def sample() -> GenerateResult:
        async with VLLMClient(base_url=server.url, api="generate") as client:
            request = GenerateRequest(prompt_token_ids=prompt, sampling=SamplingParams(max_tokens=8, seed=3))
            return await client.generate(request)

    before = asyncio.run(sample())
    backend.post("/pause", params={"mode": "wait"})
    bad = backend.post("/collective_rpc", json={"method": "reload_weights", "kwargs": {"weights_path": "/nonexist"}})
    assert bad.status_code == 400 and "cannot load weights" in bad.json()["error"]["message"]
    loaded = backend.post("/collective_rpc", json={"method": "reload_weights", "kwargs": {"weights_path": str(other)}})
    assert loaded.status_code == 200
    backend.post("/update_weight_version", json={"new_version": "1"})
    backend.post("/resume")
    try:
        after = asyncio.run(sample())
        new_teacher = teacher_for(other)
        want = new_teacher(prompt + after.token_ids)[len(prompt) :]
        assert max(abs(a - b) for a, b in zip(after.logprobs, want, strict=True)) <= 1e-4
        assert after.cached_tokens == 0, "the prefix cache held the old weights' KV: it was dropped"
        assert after.weight_versions == [(1, 0, len(after.token_ids))]
        old = teacher(prompt + before.token_ids)[len(prompt) :]
        assert max(abs(a - b) for a, b in zip(before.logprobs, old, strict=True)) <= 1e-4
    finally:
        backend.post("/pause", params={"mode": "wait"})
        backend.post(
            "/collective_rpc",
            json={"method": "reload_weights", "kwargs": {"weights_path": str(server.model_dir)}},
        )
        backend.post("/resume")


def test_control_routes_refuse_what_they_cannot_do(backend):
    assert backend.post("/pause", params={"mode": "sideways"}).status_code == 400
    assert backend.post("/update_weight_version", json={"new_version": "v2"}).status_code == 400
    assert backend.post("/collective_rpc", json={"method": "sleep"}).status_code == 400
