"""Reasoning in each format's answer and stream, read back with the SDKs' own types: before the text,
and a model that thinks again after some text (GLM) gets a block or item per stretch."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from typing import Any

import anthropic.types
import openai.types.chat
import openai.types.responses

from farm.proxy import anthropic_messages, openai_chat, openai_responses
from farm.proxy.conversation import Reply, ToolCall
from farm.proxy.events import Event, Finished, ReasoningDelta, Started, TextDelta, ToolCallEvent, Usage

CALL = ToolCall(id="call_1", name="bash", arguments='{"command": "ls"}')


def _done(reasoning: str, content: str, calls: list[ToolCall] | None = None) -> Finished:
    reply = Reply(content=content, tool_calls=calls or [], finish_reason="tool_calls" if calls else "stop")
    return Finished(reply=reply, usage=Usage(3, 5), seq=0, token_ids=[1] * 5, logprobs=[0.0] * 5, reasoning=reasoning)


async def _events(*events: Event) -> AsyncIterator[Event]:
    for event in events:
        yield event


def _collect(stream: AsyncIterator[bytes]) -> list[dict[str, Any]]:
    async def run() -> list[bytes]:
        return [chunk async for chunk in stream]

    out = []
    for chunk in asyncio.run(run()):
        data = chunk.decode().split("data: ", 1)[1].strip()
        if data != "[DONE]":
            out.append(json.loads(data))
    return out


def test_whole_answers_carry_the_reasoning_where_each_sdk_reads_it() -> None:
    done = _done("\nplan\n", "\n\nhello")
    chat = openai.types.chat.ChatCompletion.model_validate(
        openai_chat.response(done, model="m", completion_id="c", logprobs=False)
    )
    assert (chat.choices[0].message.model_extra or {})["reasoning_content"] == "\nplan\n"
    assert chat.choices[0].message.content == "\n\nhello"
    # (Response.model_validate would want fields the proxy's answer does not echo here; the SDK
    # itself builds its objects leniently, as the integration test shows.)
    output = openai_responses.response(done, model="m", response_id="r", echo={})["output"]
    item = openai.types.responses.ResponseReasoningItem.model_validate(output[0])
    assert item.content is not None and item.content[0].text == "\nplan\n"
    assert output[1]["content"][0]["text"] == "\n\nhello"
    message = anthropic.types.Message.model_validate(anthropic_messages.response(done, model="m", message_id="x"))
    thinking, text = message.content
    assert isinstance(thinking, anthropic.types.ThinkingBlock) and thinking.thinking == "\nplan\n"
    assert thinking.signature == anthropic_messages.signature("\nplan\n")
    assert isinstance(text, anthropic.types.TextBlock) and text.text == "\n\nhello"


def test_no_reasoning_no_reasoning_fields() -> None:
    done = _done("", "hello")
    chat = openai_chat.response(done, model="m", completion_id="c", logprobs=False)
    assert "reasoning_content" not in chat["choices"][0]["message"]
    assert [i["type"] for i in openai_responses.response(done, model="m", response_id="r", echo={})["output"]] == [
        "message"
    ]
    assert [b["type"] for b in anthropic_messages.response(done, model="m", message_id="x")["content"]] == ["text"]


EVENTS: list[Event] = [
    Started(seq=0, prompt_tokens=3),
    ReasoningDelta("pl"),
    ReasoningDelta("an"),
    TextDelta("hi"),
    ReasoningDelta("again"),
    ToolCallEvent(index=0, call=CALL),
]


def test_chat_streams_reasoning_content_deltas_in_order() -> None:
    chunks = _collect(
        openai_chat.stream(
            _events(*EVENTS, _done("plagain", "hi", [CALL])),
            model="m",
            completion_id="c",
            include_usage=False,
            logprobs=False,
        )
    )
    deltas = [openai.types.chat.ChatCompletionChunk.model_validate(c).choices[0].delta for c in chunks]
    said = [
        ("reasoning", (d.model_extra or {})["reasoning_content"])
        if "reasoning_content" in (d.model_extra or {})
        else d.content
        for d in deltas
    ]
    assert said[:5] == ["", ("reasoning", "pl"), ("reasoning", "an"), "hi", ("reasoning", "again")]


def test_anthropic_streams_a_thinking_block_per_stretch_each_signed() -> None:
    chunks = _collect(
        anthropic_messages.stream(_events(*EVENTS, _done("plagain", "hi", [CALL])), model="m", message_id="x")
    )
    blocks = [(c["index"], c["content_block"]["type"]) for c in chunks if c["type"] == "content_block_start"]
    assert blocks == [(0, "thinking"), (1, "text"), (2, "thinking"), (3, "tool_use")]
    deltas = [(c["index"], c["delta"]["type"]) for c in chunks if c["type"] == "content_block_delta"]
    assert deltas == [
        (0, "thinking_delta"),
        (0, "thinking_delta"),
        (0, "signature_delta"),
        (1, "text_delta"),
        (2, "thinking_delta"),
        (2, "signature_delta"),
        (3, "input_json_delta"),
    ]
    signatures = [c["delta"]["signature"] for c in chunks if c.get("delta", {}).get("type") == "signature_delta"]
    assert signatures == [anthropic_messages.signature("plan"), anthropic_messages.signature("again")]
    stops = [c["index"] for c in chunks if c["type"] == "content_block_stop"]
    assert stops == [0, 1, 2, 3]


def test_responses_streams_a_reasoning_item_per_stretch() -> None:
    chunks = _collect(
        openai_responses.stream(_events(*EVENTS, _done("plagain", "hi", [CALL])), model="m", response_id="r", echo={})
    )
    added = [(c["output_index"], c["item"]["type"]) for c in chunks if c["type"] == "response.output_item.added"]
    assert added == [(0, "reasoning"), (1, "message"), (2, "reasoning"), (3, "function_call")]
    deltas = [(c["output_index"], c["delta"]) for c in chunks if c["type"] == "response.reasoning_text.delta"]
    assert deltas == [(0, "pl"), (0, "an"), (2, "again")]
    done = [(c["output_index"], c["text"]) for c in chunks if c["type"] == "response.reasoning_text.done"]
    assert done == [(0, "plan"), (2, "again")]
    completed = chunks[-1]["response"]["output"]
    assert [i["type"] for i in completed] == ["reasoning", "message", "reasoning", "function_call"]
    first = openai.types.responses.ResponseReasoningItem.model_validate(completed[0])
    assert first.content is not None and first.content[0].text == "plan"
    assert first.status == "completed"
