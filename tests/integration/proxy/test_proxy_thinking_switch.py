"""The per-request thinking switch (``farm.proxy.template_kwargs``) on the qwen3 family's tiny model:
Chat Completions' ``chat_template_kwargs``, Anthropic's ``thinking`` and Responses' ``reasoning``
reach the chat template (thinking off: the generation prompt ends with an empty think block) and the
reasoning parser (the whole answer is content), the usage counts the reasoning's tokens, a call with
other kwargs does not continue one rendered without them, and bad kwargs are a 400."""

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

WORD = "SWITCHTEST"
THINKING = "<think>\nplan it\n</think>\n\nhello"
# The script answers a prompt whose template closed the think block with the answer alone.
RULES = {"rules": [{"match": f"(?s){WORD}.*</think>\\s*$", "turns": ["hello"]}, {"match": WORD, "turns": [THINKING]}]}
PROMPT: Any = [{"role": "user", "content": f"{WORD}: say hello"}]


@pytest.fixture(scope="module")
def stack(qwen3_scripted: Qwen3Scripted) -> Iterator[EmbeddedStack]:
    with qwen3_scripted("qwen3switch", RULES, stages=()) as stack:
        yield stack


@pytest.fixture(scope="module")
def api(stack: EmbeddedStack) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=stack.settings.api_url, headers=TOKEN, timeout=60) as client:
        yield client


@pytest.fixture
def trial(api: httpx.Client) -> dict[str, Any]:
    resp = api.post("/v1/trials", json={})
    assert resp.status_code == 201, resp.text
    return dict(resp.json())


@pytest.fixture(scope="module")
def tok(family_model_dir: Callable[[str], Path]) -> Any:
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(family_model_dir("qwen3"))


def _prompts(api: httpx.Client, trial: dict[str, Any], tok: Any) -> list[str]:
    """Each call's prompt as the backend got it (the record's ids before the call's own)."""
    record = api.get(f"/v1/trials/{trial['id']}/record").json()
    texts = []
    for segment in record["segment_tokens"]:
        ids = segment["token_ids"]
        for kind, start, _, _ in segment["spans"]:
            if kind == "model":
                texts.append(tok.decode(ids[:start]))
    return texts


def test_chat_template_kwargs_turn_thinking_off_for_the_template_and_the_parser(
    api: httpx.Client, trial: dict[str, Any], tok: Any
) -> None:
    client = openai.OpenAI(base_url=trial["openai_base_url"], api_key=trial["key"])
    off = client.chat.completions.create(
        model="m", messages=PROMPT, max_tokens=32, extra_body={"chat_template_kwargs": {"enable_thinking": False}}
    )
    message = off.choices[0].message
    assert message.content == "hello" and not (message.model_extra or {}).get("reasoning_content")
    assert off.usage is not None and off.usage.completion_tokens_details is not None
    assert off.usage.completion_tokens_details.reasoning_tokens == 0
    on = client.chat.completions.create(model="m", messages=PROMPT, max_tokens=32)
    assert (on.choices[0].message.model_extra or {})["reasoning_content"].strip() == "plan it"
    assert on.usage is not None and on.usage.completion_tokens_details is not None
    # "\n", "plan", " it", "\n" between the tags, as vLLM counts them.
    assert on.usage.completion_tokens_details.reasoning_tokens == len(tok.encode("\nplan it\n"))
    first, second = _prompts(api, trial, tok)
    assert first.endswith("<|im_start|>assistant\n<think>\n\n</think>\n\n")
    assert second.endswith("<|im_start|>assistant\n")


def test_streamed_chat_with_thinking_off_is_all_content(trial: dict[str, Any]) -> None:
    client = openai.OpenAI(base_url=trial["openai_base_url"], api_key=trial["key"])
    reasoning, content = "", ""
    for chunk in client.chat.completions.create(
        model="m",
        messages=PROMPT,
        max_tokens=32,
        stream=True,
        extra_body={"chat_template_kwargs": {"enable_thinking": False}},
    ):
        if chunk.choices:
            reasoning += (chunk.choices[0].delta.model_extra or {}).get("reasoning_content") or ""
            content += chunk.choices[0].delta.content or ""
    assert (reasoning, content) == ("", "hello")


def test_anthropic_thinking_disabled_and_enabled(trial: dict[str, Any]) -> None:
    client = anthropic.Anthropic(base_url=trial["anthropic_base_url"], api_key=trial["key"])
    off = client.messages.create(model="m", max_tokens=32, messages=PROMPT, thinking={"type": "disabled"})
    assert [b.type for b in off.content] == ["text"] and off.content[0].text == "hello"  # type: ignore[union-attr]
    on = client.messages.create(
        model="m", max_tokens=2048, messages=PROMPT, thinking={"type": "enabled", "budget_tokens": 1024}
    )
    assert [b.type for b in on.content] == ["thinking", "text"]
    # Claude 4.6's adaptive thinking (what Claude Code sends): on, with no budget to check.
    body: Any = {"type": "adaptive"}
    adaptive = client.messages.create(model="m", max_tokens=32, messages=PROMPT, thinking=body)
    assert [b.type for b in adaptive.content] == ["thinking", "text"]


def test_responses_reasoning_effort_none_turns_thinking_off(trial: dict[str, Any], tok: Any) -> None:
    client = openai.OpenAI(base_url=trial["openai_base_url"], api_key=trial["key"])
    off = client.responses.create(model="m", input=PROMPT, max_output_tokens=32, reasoning={"effort": "none"})
    assert [o.type for o in off.output] == ["message"] and off.output_text == "hello"
    assert off.usage is not None and off.usage.output_tokens_details.reasoning_tokens == 0
    on = client.responses.create(model="m", input=PROMPT, max_output_tokens=32, reasoning={"effort": "low"})
    assert [o.type for o in on.output] == ["reasoning", "message"]
    assert on.usage is not None and on.usage.output_tokens_details.reasoning_tokens == len(tok.encode("\nplan it\n"))


def test_a_call_with_other_kwargs_is_another_prompt(api: httpx.Client, trial: dict[str, Any]) -> None:
    client = openai.OpenAI(base_url=trial["openai_base_url"], api_key=trial["key"])
    off: Any = {"chat_template_kwargs": {"enable_thinking": False}}
    first = client.chat.completions.create(model="m", messages=PROMPT, max_tokens=32, extra_body=off)
    history: Any = [
        *PROMPT,
        first.choices[0].message.model_dump(exclude_none=True),
        {"role": "user", "content": "again"},
    ]
    client.chat.completions.create(model="m", messages=history, max_tokens=32, extra_body=off)
    client.chat.completions.create(model="m", messages=history, max_tokens=32)
    certificate = api.get(f"/v1/trials/{trial['id']}/record").json()["certificate"]
    # Same kwargs: the second call continues the first; without them the third starts afresh.
    assert [c["extends"] for c in certificate] == [None, 0, None]


@pytest.mark.parametrize(
    ("body", "message"),
    [
        ({"chat_template_kwargs": {"enable_thinking": [1]}}, "must be a string, number, boolean or null"),
        ({"chat_template_kwargs": {"tokenize": True}}, "set by the proxy itself"),
        ({"chat_template_kwargs": "enable_thinking"}, "must be an object"),
        ({"chat_template_kwargs": {f"k{i}": 1 for i in range(17)}}, "at most 16"),
        ({"chat_template_kwargs": {"x": "y" * 257}}, "longer than 256"),
    ],
)
def test_bad_chat_template_kwargs_are_a_400(trial: dict[str, Any], body: dict[str, Any], message: str) -> None:
    resp = httpx.post(
        f"{trial['openai_base_url']}/chat/completions",
        headers={"Authorization": f"Bearer {trial['key']}"},
        json={"model": "m", "messages": PROMPT, "max_tokens": 4, **body},
    )
    assert resp.status_code == 400 and message in resp.json()["error"]["message"], resp.text


def test_bad_thinking_and_reasoning_params_are_a_400(trial: dict[str, Any]) -> None:
    headers = {"x-api-key": trial["key"], "anthropic-version": "2023-06-01"}
    base = {"model": "m", "messages": PROMPT}
    resp = httpx.post(
        f"{trial['anthropic_base_url']}/v1/messages",
        headers=headers,
        json={**base, "max_tokens": 64, "thinking": {"type": "enabled"}},
    )
    assert resp.status_code == 400 and "budget_tokens" in resp.json()["error"]["message"], resp.text
    resp = httpx.post(
        f"{trial['anthropic_base_url']}/v1/messages",
        headers=headers,
        json={**base, "max_tokens": 64, "thinking": {"type": "enabled", "budget_tokens": 1024}},
    )
    assert resp.status_code == 400 and "greater than" in resp.json()["error"]["message"], resp.text
    resp = httpx.post(
        f"{trial['openai_base_url']}/responses",
        headers={"Authorization": f"Bearer {trial['key']}"},
        json={"model": "m", "input": "hi", "reasoning": {"effort": "bogus"}},
    )
    assert resp.status_code == 400 and "reasoning.effort" in resp.json()["error"]["message"], resp.text
