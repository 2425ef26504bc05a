"""A trial's history policy through the proxy, with the qwen3 family's tiny model (real tokenizer and
template, which drops past reasoning): a three-turn conversation on the openai SDK (reasoning and a
tool call, the result, a user turn) is one segment under ``exact`` and one per turn under
``template``; either way every sampled id is the script's, and each segment's ids are exactly the
prompts the backend was given."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest

from farm.embedded import EmbeddedStack
from tests.integration.proxy.conftest import TOKEN, Qwen3Scripted

# The model-family suite (--run-matrix, which .ci/run passes): the default suite keeps to its time.
pytestmark = [pytest.mark.integration, pytest.mark.matrix]

WORD = "HISTORYTEST"
CALL = '<tool_call>\n{"name": "bash", "arguments": {"cmd": "ls"}}\n</tool_call>'
TURNS = [
    f"<think>\nlook first\n</think>\n\n{CALL}",
    "<think>\nseen it\n</think>\n\nfound a.txt",
    "<think>\nwelcome\n</think>\n\nbye",
]
TOOLS: Any = [
    {
        "type": "function",
        "function": {"name": "bash", "parameters": {"type": "object", "properties": {"cmd": {"type": "string"}}}},
    }
]


@pytest.fixture(scope="module")
def qwen3_stack(qwen3_scripted: Qwen3Scripted) -> Iterator[EmbeddedStack]:
    with qwen3_scripted("qwen3history", {"rules": [{"match": WORD, "turns": TURNS}]}) as stack:
        yield stack


@pytest.fixture(scope="module")
def api(qwen3_stack: EmbeddedStack) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=qwen3_stack.settings.api_url, headers=TOKEN, timeout=60) as client:
        yield client


def _converse(trial: dict[str, Any]) -> None:
    """The harness: a tool call answered, an answer, a user turn, each reply echoed as the SDK gave it."""
    client = openai.OpenAI(base_url=trial["openai_base_url"], api_key=trial["key"])
    messages: Any = [{"role": "system", "content": "be brief"}, {"role": "user", "content": f"{WORD}: list files"}]
    first = client.chat.completions.create(model="m", messages=messages, tools=TOOLS, max_tokens=64).choices[0]
    assert first.finish_reason == "tool_calls" and (first.message.model_extra or {})["reasoning_content"]
    (call,) = first.message.tool_calls or []
    messages += [
        first.message.model_dump(exclude_none=True),
        {"role": "tool", "tool_call_id": call.id, "content": "a.txt"},
    ]
    second = client.chat.completions.create(model="m", messages=messages, tools=TOOLS, max_tokens=64).choices[0]
    assert (second.message.content or "").strip() == "found a.txt"  # vLLM keeps the "\n\n" too
    messages += [second.message.model_dump(exclude_none=True), {"role": "user", "content": "thanks"}]
    third = client.chat.completions.create(model="m", messages=messages, tools=TOOLS, max_tokens=64).choices[0]
    assert (third.message.content or "").strip() == "bye"


def _record(api: httpx.Client, history: str | None) -> dict[str, Any]:
    resp = api.post("/v1/trials", json={"history": history} if history else {})
    assert resp.status_code == 201, resp.text
    trial = resp.json()
    _converse(trial)
    assert api.post(f"/v1/trials/{trial['id']}/end").status_code == 200
    return dict(api.get(f"/v1/trials/{trial['id']}/record").json())


def _model_texts(tok: Any, segment: dict[str, Any]) -> list[str]:
    ids = segment["token_ids"]
    return [tok.decode(ids[s:e]) for kind, s, e, _ in segment["spans"] if kind == "model"]


@pytest.fixture(scope="module")
def tok(family_model_dir: Callable[[str], Path]) -> Any:
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(family_model_dir("qwen3"))


def test_history_exact_is_one_segment_with_every_sampled_id(api: httpx.Client, tok: Any) -> None:
    record = _record(api, None)  # the default
    assert record["history"] == "exact" and record["segments"] == 1
    (segment,) = record["segment_tokens"]
    assert segment["calls"] == [0, 1, 2]
    # Drift 0: the model's ids are the script's, reasoning and end of turn included, and the rest is
    # the template's text for the new messages between them, nothing re-rendered.
    assert _model_texts(tok, segment) == [t + "<|im_end|>" for t in TURNS]
    text = tok.decode(segment["token_ids"])
    assert text.endswith(
        TURNS[0] + "<|im_end|>\n<|im_start|>user\n<tool_response>\na.txt\n</tool_response><|im_end|>\n"
        "<|im_start|>assistant\n" + TURNS[1] + "<|im_end|>\n<|im_start|>user\nthanks<|im_end|>\n"
        "<|im_start|>assistant\n" + TURNS[2] + "<|im_end|>"
    )
    assert tok.encode(text, add_special_tokens=False) == segment["token_ids"]
    later = record["certificate"][1:]
    assert [c["extends"] for c in later] == [0, 1]
    # The template would have dropped each earlier reasoning block: the first ids of each reply. The
    # answer's "\n\n" after </think> is the echoed content's (the SDK gave it), which the template keeps.
    dropped = []
    for entry, (kind, start, _, _) in zip(later, [s for s in segment["spans"] if s[0] == "model"], strict=False):
        assert kind == "model" and entry["history"] == "exact" and entry["template_inserted_tokens"] == 0
        dropped.append(tok.decode(segment["token_ids"][start : start + entry["template_dropped_tokens"]]))
    assert dropped == ["<think>\nlook first\n</think>\n\n", "<think>\nseen it\n</think>"]


def test_history_template_is_a_segment_per_turn(api: httpx.Client, tok: Any) -> None:
    record = _record(api, "template")
    assert record["history"] == "template" and record["segments"] == 3
    segments = record["segment_tokens"]
    assert [s["calls"] for s in segments] == [[0], [1], [2]]
    assert [_model_texts(tok, s) for s in segments] == [[t + "<|im_end|>"] for t in TURNS]
    # Each later turn's prompt is the template's: the earlier reasoning is gone from it.
    for segment in segments[1:]:
        assert "look first" not in tok.decode(segment["token_ids"])
    for entry in record["certificate"][1:]:
        assert entry["history"] == "template" and entry["extends"] is None
        assert "differently once the new messages follow" in entry["reason"]
