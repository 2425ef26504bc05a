"""A reasoning model's thinking on the wire: the qwen3 family's tiny model (real tokenizer and
template, so the proxy chooses the ``qwen3`` reasoning parser by itself) scripted to think, read by
the real openai and anthropic SDKs, streamed and not; the record keeps every sampled id."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import anthropic
import httpx
import openai
import pytest

from farm.embedded import EmbeddedStack
from tests.integration.proxy.conftest import TOKEN, Qwen3Scripted

# The model-family suite (--run-matrix, which .ci/run passes): the default suite keeps to its time.
pytestmark = [pytest.mark.integration, pytest.mark.matrix]

WORD = "THINKTEST"
ANSWER = "<think>\nplan\n</think>\n\nhello"
#: typed loosely: the SDKs each want their own message type.
PROMPT: Any = [{"role": "user", "content": f"{WORD}: say hello"}]


@pytest.fixture(scope="module")
def qwen3_stack(qwen3_scripted: Qwen3Scripted) -> Iterator[EmbeddedStack]:
    with qwen3_scripted("qwen3test", {"rules": [{"match": WORD, "turns": [ANSWER]}]}) as stack:
        yield stack


@pytest.fixture(scope="module")
def api(qwen3_stack: EmbeddedStack) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=qwen3_stack.settings.api_url, headers=TOKEN, timeout=60) as client:
        yield client


@pytest.fixture
def trial(api: httpx.Client) -> dict[str, Any]:
    resp = api.post("/v1/trials", json={})
    assert resp.status_code == 201, resp.text
    return dict(resp.json())


def _split_as_qwen3(reasoning: str, content: str) -> None:
    assert reasoning.strip() == "plan" and "<think>" not in reasoning and "</think>" not in reasoning
    assert content.strip() == "hello" and "think>" not in content


def _sampled_text(api: httpx.Client, trial: dict[str, Any], model_dir: Path) -> str:
    """Every id the trial's one call sampled, decoded: the reasoning is in the record either way."""
    from transformers import AutoTokenizer

    record = api.get(f"/v1/trials/{trial['id']}/record").json()
    (segment,) = record["segment_tokens"]
    sampled = [t for t, m in zip(segment["token_ids"], segment["loss_mask"], strict=True) if m]
    return str(AutoTokenizer.from_pretrained(str(model_dir)).decode(sampled, skip_special_tokens=False))


@pytest.mark.parametrize("streamed", [False, True], ids=["whole", "streamed"])
def test_chat_completions_reasoning_content(
    api: httpx.Client, trial: dict[str, Any], family_model_dir: Callable[[str], Path], streamed: bool
) -> None:
    client = openai.OpenAI(base_url=trial["openai_base_url"], api_key=trial["key"])
    if streamed:
        reasoning, content = "", ""
        for chunk in client.chat.completions.create(model="m", messages=PROMPT, max_tokens=64, stream=True):
            if chunk.choices:
                delta = chunk.choices[0].delta
                reasoning += (delta.model_extra or {}).get("reasoning_content") or ""
                content += delta.content or ""
    else:
        answer = client.chat.completions.create(model="m", messages=PROMPT, max_tokens=64)
        message = answer.choices[0].message
        reasoning, content = (message.model_extra or {})["reasoning_content"], message.content or ""
        assert answer.choices[0].finish_reason == "stop"
    _split_as_qwen3(reasoning, content)
    assert _sampled_text(api, trial, family_model_dir("qwen3")) == ANSWER + "<|im_end|>"


@pytest.mark.parametrize("streamed", [False, True], ids=["whole", "streamed"])
def test_responses_reasoning_item(api: httpx.Client, trial: dict[str, Any], streamed: bool) -> None:
    client = openai.OpenAI(base_url=trial["openai_base_url"], api_key=trial["key"])
    if streamed:
        deltas = ""
        final: Any = None
        for event in client.responses.create(model="m", input=PROMPT, max_output_tokens=64, stream=True):
            if event.type == "response.reasoning_text.delta":
                deltas += event.delta
            elif event.type == "response.completed":
                final = event.response
        assert final is not None
    else:
        final = client.responses.create(model="m", input=PROMPT, max_output_tokens=64)
    item, message = final.output
    assert item.type == "reasoning" and item.content[0].type == "reasoning_text"
    if streamed:
        assert deltas == item.content[0].text
    _split_as_qwen3(item.content[0].text, final.output_text)
    assert message.type == "message"


@pytest.mark.parametrize("streamed", [False, True], ids=["whole", "streamed"])
def test_anthropic_thinking_block(api: httpx.Client, trial: dict[str, Any], streamed: bool) -> None:
    client = anthropic.Anthropic(base_url=trial["anthropic_base_url"], api_key=trial["key"])
    final: Any
    if streamed:
        with client.messages.stream(model="m", max_tokens=64, messages=PROMPT) as stream:
            kinds = [(e.type, getattr(getattr(e, "delta", None), "type", None)) for e in stream]
            final = stream.get_final_message()
        assert ("content_block_delta", "thinking_delta") in kinds
        assert ("content_block_delta", "signature_delta") in kinds
    else:
        final = client.messages.create(model="m", max_tokens=64, messages=PROMPT)
    thinking, text = final.content
    assert thinking.type == "thinking" and text.type == "text"
    assert thinking.signature  # the SDK's ThinkingBlock requires one; the harness echoes it back
    _split_as_qwen3(thinking.thinking, text.text)
    assert final.stop_reason == "end_turn"
    # A harness echoes the thinking block back: it is read (and dropped) as before.
    echo = [
        *PROMPT,
        {"role": "assistant", "content": [b.model_dump() for b in final.content]},
        {"role": "user", "content": "again"},
    ]
    count = client.messages.count_tokens(model="m", messages=echo)
    assert count.input_tokens > 0
