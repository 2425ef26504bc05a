"""A harness conversation with thinking and tool calls through the proxy, with real vLLM (CPU) as its
backend serving the tiny qwen3 fixture (Qwen3ForCausalLM, the real Qwen3 tokenizer and chat template).

Opt-in (``--run-vllm``; build the environment with ``scripts/setup_vllm.sh``). The harness is the real
``openai`` SDK: a reply with reasoning and a tool call, the tool's result, an answer (streamed), a user
turn, an answer. A random tiny model writes no ``<think>`` or ``<tool_call>`` by itself, so vLLM runs
with a logits processor (``vllm_reply_shapes.py``, which says why not structured outputs) that gives each
reply that shape and lets the model sample its words; vLLM still returns the model's own logprobs.

Checked per history policy: the ids the proxy recorded are the ids vLLM answers for the same prompt
and seed (asked again through the farm's token-in/token-out ``VLLMClient``), every recorded logprob is
within 1e-4 of a teacher-forced recompute of the same weights (transformers), and the segments are
what the policy says: one under ``exact`` (the certificate counting the reasoning the template would
drop), one per turn under ``template``. Run with ``-s`` for the figures.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest
from openai.types.chat import ChatCompletionMessageFunctionToolCall

from farm.embedded import EmbeddedStack
from farm.llm.client import VLLMClient
from farm.llm.types import GenerateRequest, SamplingParams
from tests.conftest import teacher_for
from tests.integration.conftest import side_redis_url, stack_settings
from tests.integration.llm.conftest import running_vllm

pytestmark = [pytest.mark.vllm, pytest.mark.timeout(900)]

TOKEN = {"Authorization": "Bearer e2e-token"}
TOLERANCE = 1e-4
SHAPES = Path(__file__).with_name("vllm_reply_shapes.py")
MAX_TOKENS = 64
#: the harness's seed per turn: vLLM asked again with it samples the same words.
SEEDS = (11, 12, 13)
TOOLS: Any = [
    {
        "type": "function",
        "function": {
            "name": "ls",
            "description": "List a directory",
            "parameters": {"type": "object", "properties": {"path": {"type": "string"}}, "required": ["path"]},
        },
    }
]


@pytest.fixture(scope="module")
def qwen3_dir(family_model_dir: Callable[[str], Path]) -> Path:
    return family_model_dir("qwen3")


@pytest.fixture(scope="module")
def qwen3_vllm(qwen3_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    with running_vllm(
        qwen3_dir,
        name="qwen3-tiny",
        tmp_path_factory=tmp_path_factory,
        # Eager: no torch.compile warm-up (~40 s of the cold start on two cores).
        extra_args=["--logits-processors", f"{SHAPES.stem}:ReplyShapes", "--enforce-eager"],
        extra_env={"PYTHONPATH": str(SHAPES.parent)},
    ) as url:
        yield url


@pytest.fixture(scope="module")
def api(
    qwen3_vllm: str, qwen3_dir: Path, tmp_path_factory: pytest.TempPathFactory, module_pg_url: str, redis_url: str
) -> Iterator[httpx.Client]:
    """The farm's API (which serves the proxy) with vLLM as its one backend, the tokenizer the model's."""
    import redis

    url = side_redis_url(redis_url, 0)
    redis.Redis.from_url(url).flushdb()
    settings = stack_settings(
        tmp_path_factory.mktemp("qwen3-vllm-farm"), redis_url=url, database_url=module_pg_url, node="qwen3vllm"
    )
    settings = settings.model_copy(update={"llm": settings.llm.model_copy(update={"tokenizer_dir": qwen3_dir})})
    with (
        EmbeddedStack(settings, with_flower=False, with_llm=False, stages=()),
        httpx.Client(base_url=settings.api_url, headers=TOKEN, timeout=120) as client,
    ):
        backend = {"id": "vllm-qwen3", "url": qwen3_vllm, "kind": "vllm", "capacity": 4}
        assert client.post("/v1/backends", json=backend).status_code in (200, 201)
        yield client
    redis.Redis.from_url(url).flushdb()


def converse(trial: dict[str, Any]) -> None:
    """The harness: each reply echoed as the SDK gave it."""
    with openai.OpenAI(base_url=trial["openai_base_url"], api_key=trial["key"]) as client:
        messages: Any = [{"role": "system", "content": "be brief"}, {"role": "user", "content": "what is in /srv?"}]
        first = client.chat.completions.create(
            model="qwen3", messages=messages, tools=TOOLS, max_tokens=MAX_TOKENS, seed=SEEDS[0]
        ).choices[0]
        assert first.finish_reason == "tool_calls"
        assert (first.message.model_extra or {}).get("reasoning_content"), "the reasoning is split from the answer"
        (call,) = first.message.tool_calls or []
        assert isinstance(call, ChatCompletionMessageFunctionToolCall) and call.function.name == "ls"
        assert set(json.loads(call.function.arguments)) == {"path"}
        messages += [
            first.message.model_dump(exclude_none=True),
            {"role": "tool", "tool_call_id": call.id, "content": "a.txt\nb.txt"},
        ]
        # Streamed: the proxy streams from vLLM too.
        stream = client.chat.completions.create(
            model="qwen3", messages=messages, tools=TOOLS, max_tokens=MAX_TOKENS, seed=SEEDS[1], stream=True
        )
        reasoning, content, finish = "", "", None
        for chunk in stream:
            for choice in chunk.choices:
                reasoning += (choice.delta.model_extra or {}).get("reasoning_content") or ""
                content += choice.delta.content or ""
                finish = choice.finish_reason or finish
        assert finish == "stop" and reasoning.strip() and content.strip()
        messages += [{"role": "assistant", "content": content}, {"role": "user", "content": "thanks, and?"}]
        third = client.chat.completions.create(
            model="qwen3", messages=messages, tools=TOOLS, max_tokens=MAX_TOKENS, seed=SEEDS[2]
        ).choices[0]
        assert third.finish_reason == "stop" and (third.message.content or "").strip()


def record_of(api: httpx.Client, history: str) -> dict[str, Any]:
    resp = api.post("/v1/trials", json={"history": history})
    assert resp.status_code == 201, resp.text
    trial = resp.json()
    converse(trial)
    assert api.post(f"/v1/trials/{trial['id']}/end").status_code == 200
    return dict(api.get(f"/v1/trials/{trial['id']}/record").json())


def model_spans(record: dict[str, Any]) -> list[tuple[dict[str, Any], int, int, int]]:
    """Each call's sampled span, in call order: (segment, start, end, call)."""
    spans = [(seg, s, e, c) for seg in record["segment_tokens"] for kind, s, e, c in seg["spans"] if kind == "model"]
    return sorted(spans, key=lambda span: span[3])


async def vllm_answers(url: str, prompts: list[list[int]]) -> list[Any]:
    async with VLLMClient(base_url=url) as client:
        return [
            await client.generate(
                GenerateRequest(prompt_token_ids=prompt, sampling=SamplingParams(max_tokens=MAX_TOKENS, seed=seed))
            )
            for prompt, seed in zip(prompts, SEEDS, strict=True)
        ]


def check_tokens(record: dict[str, Any], vllm_url: str, teacher: Callable[[list[int]], list[float]]) -> dict[str, Any]:
    """The record's ids are vLLM's and its logprobs the model's; returns the figures."""
    spans = model_spans(record)
    assert [call for *_, call in spans] == [0, 1, 2]
    # vLLM asked again, token in, for each call's prompt as the record has it, with the turn's seed.
    answers = asyncio.run(vllm_answers(vllm_url, [seg["token_ids"][:start] for seg, start, _, _ in spans]))
    from_vllm = 0.0
    for (seg, start, end, call), answer in zip(spans, answers, strict=True):
        assert seg["token_ids"][start:end] == answer.token_ids, f"call {call}"
        got = seg["logprobs"][start:end]
        from_vllm = max(from_vllm, *(abs(a - b) for a, b in zip(got, answer.logprobs, strict=True)))
    assert from_vllm <= TOLERANCE
    checked, worst = 0, 0.0
    for seg in record["segment_tokens"]:
        forced = teacher(seg["token_ids"])
        for i, mask in enumerate(seg["loss_mask"]):
            if mask:
                checked += 1
                worst = max(worst, abs(seg["logprobs"][i] - forced[i]))
    assert checked == sum(end - start for _, start, end, _ in spans)
    assert worst <= TOLERANCE
    return {"tokens": checked, "max_diff_teacher": worst, "max_diff_vllm": from_vllm, "segments": record["segments"]}


@pytest.fixture(scope="module")
def qwen3_teacher(qwen3_dir: Path) -> Callable[[list[int]], list[float]]:
    return teacher_for(qwen3_dir)


def test_vllm_qwen3_conversation_is_one_segment_under_exact(
    api: httpx.Client, qwen3_vllm: str, qwen3_teacher: Callable[[list[int]], list[float]], qwen3_dir: Path
) -> None:
    from transformers import AutoTokenizer

    record = record_of(api, "exact")
    assert record["history"] == "exact" and record["segments"] == 1
    (segment,) = record["segment_tokens"]
    assert segment["calls"] == [0, 1, 2]
    figures = check_tokens(record, qwen3_vllm, qwen3_teacher)
    # Every sampled id is in the one sequence, reasoning included: the template would have dropped
    # each earlier reply's <think> block, and the certificate counts it.
    tok: Any = AutoTokenizer.from_pretrained(qwen3_dir)
    replies = [tok.decode(segment["token_ids"][s:e]) for _, s, e, _ in model_spans(record)]
    assert all(r.startswith("<think>\n") and r.endswith("<|im_end|>") for r in replies)
    assert "<tool_call>" in replies[0]
    later = record["certificate"][1:]
    assert [c["extends"] for c in later] == [0, 1]
    assert all(c["history"] == "exact" and c["template_dropped_tokens"] > 0 for c in later)
    print(f"\nvLLM qwen3 exact: {figures}")


def test_vllm_qwen3_conversation_is_a_segment_per_turn_under_template(
    api: httpx.Client, qwen3_vllm: str, qwen3_teacher: Callable[[list[int]], list[float]]
) -> None:
    record = record_of(api, "template")
    assert record["history"] == "template" and record["segments"] == 3
    assert [s["calls"] for s in record["segment_tokens"]] == [[0], [1], [2]]
    figures = check_tokens(record, qwen3_vllm, qwen3_teacher)
    for entry in record["certificate"][1:]:
        assert entry["history"] == "template" and entry["extends"] is None
        assert "differently once the new messages follow" in entry["reason"]
    print(f"\nvLLM qwen3 template: {figures}")
