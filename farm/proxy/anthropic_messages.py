"""Anthropic Messages (``POST /v1/messages``, ``/v1/messages/count_tokens``) and its error shape.

Content blocks map onto the proxy's conversation: ``text`` blocks are text, an assistant's
``tool_use`` blocks are its tool calls, and a user message's ``tool_result`` blocks are tool messages
(in order; the user's text after them is a user message). ``thinking`` blocks a harness echoes back
are dropped: the tiny template, like most chat templates, does not render them, and a reply's
thinking is never part of what the proxy gave (so dropping it keeps the history an extension).
Images and documents are a 400: the policy reads text only. Tool-call ids are ``toolu_...``.

Streaming is the SDK's event sequence: ``message_start``, ``ping``, per block
``content_block_start`` / ``content_block_delta`` (``text_delta``, ``thinking_delta`` then one
``signature_delta`` for a reasoning model's ``thinking`` block, or ``input_json_delta`` for a tool
call's arguments) / ``content_block_stop``, then ``message_delta`` (stop reason, output
tokens) and ``message_stop``. An error after the first event is an ``error`` event.
"""

from __future__ import annotations

import hashlib
import json
import secrets
from collections.abc import AsyncIterator
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from farm.errors import ProxyError
from farm.proxy import template_kwargs
from farm.proxy.conversation import ChatRequest, Message, Sampling, Tool, ToolCall
from farm.proxy.errors import CONTEXT_LENGTH, validated
from farm.proxy.events import Event, Finished, ReasoningDelta, Sampled, Started, TextDelta, ToolCallEvent
from farm.proxy.toolschema import schema_problem
from farm.proxy.wire import Answer, WireRequest

WIRE = "anthropic.messages"
CALL_ID_PREFIX = "toolu_"
_STOP_REASON = {"stop": "end_turn", "length": "max_tokens", "tool_calls": "tool_use"}


class _MessageIn(BaseModel):
    model_config = ConfigDict(extra="allow")
    # Claude Code also puts system messages among the messages.
    role: Literal["user", "assistant", "system"]
    content: str | list[dict[str, Any]]


class _ToolIn(BaseModel):
    model_config = ConfigDict(extra="allow")
    name: str
    description: str | None = None
    input_schema: dict[str, Any] = Field(default_factory=lambda: {"type": "object", "properties": {}})


class MessagesBody(BaseModel):
    model_config = ConfigDict(extra="allow")
    model: str | None = None
    messages: list[_MessageIn] = Field(min_length=1)
    system: str | list[dict[str, Any]] | None = None
    max_tokens: int = Field(ge=1)
    tools: list[_ToolIn] | None = None
    tool_choice: dict[str, Any] | None = None
    stop_sequences: list[str] | None = None
    temperature: float | None = Field(default=None, ge=0.0, le=1.0)
    top_p: float | None = Field(default=None, gt=0.0, le=1.0)
    top_k: int | None = Field(default=None, ge=1)
    stream: bool | None = False
    thinking: Any = None


class CountTokensBody(BaseModel):
    model_config = ConfigDict(extra="allow")
    model: str | None = None
    messages: list[_MessageIn] = Field(min_length=1)
    system: str | list[dict[str, Any]] | None = None
    tools: list[_ToolIn] | None = None


def _text(blocks: str | list[dict[str, Any]] | None, where: str) -> str:
    if blocks is None or isinstance(blocks, str):
        return blocks or ""
    parts = []
    for i, block in enumerate(blocks):
        kind = block.get("type")
        if kind == "text" and isinstance(block.get("text"), str):
            parts.append(block["text"])
        elif kind in ("thinking", "redacted_thinking"):
            continue
        else:
            raise ProxyError(400, f"{where}[{i}]: blocks of type {kind!r} are not supported here (text only)")
    return "".join(parts)


def _messages(body: MessagesBody | CountTokensBody) -> tuple[list[Message], list[Tool]]:
    out: list[Message] = []
    if body.system:
        out.append(Message(role="system", content=_text(body.system, "system")))
    for i, m in enumerate(body.messages):
        where = f"messages[{i}].content"
        if isinstance(m.content, str) or m.role == "system":
            out.append(Message(role=m.role, content=_text(m.content, where)))
            continue
        if m.role == "assistant":
            texts, calls = [], []
            for j, block in enumerate(m.content):
                kind = block.get("type")
                if kind == "tool_use":
                    try:
                        calls.append(
                            ToolCall(
                                id=str(block["id"]),
                                name=str(block["name"]),
                                arguments=json.dumps(block.get("input") or {}, ensure_ascii=False),
                            )
                        )
                    except KeyError as exc:
                        raise ProxyError(400, f"{where}[{j}]: a tool_use block needs id, name and input") from exc
                else:
                    texts.append(_text([block], where))
            out.append(Message(role="assistant", content="".join(texts), tool_calls=calls))
            continue
        pending: list[dict[str, Any]] = []
        for j, block in enumerate(m.content):
            if block.get("type") == "tool_result":
                if not isinstance(block.get("tool_use_id"), str):
                    raise ProxyError(400, f"{where}[{j}]: a tool_result block needs tool_use_id")
                result = _text(block.get("content"), f"{where}[{j}].content")
                if block.get("is_error"):
                    result = f"[error] {result}"
                out.append(Message(role="tool", content=result, tool_call_id=block["tool_use_id"]))
            else:
                pending.append(block)
        if pending or not m.content:
            out.append(Message(role="user", content=_text(pending, where)))
    tools = []
    for i, t in enumerate(body.tools or []):
        problem = schema_problem(t.input_schema)
        if problem is not None:
            where = f"tools.{i}.custom.input_schema"
            raise ProxyError(
                400,
                f"{where}: JSON schema is invalid. It must match JSON Schema draft 2020-12 "
                f"(https://json-schema.org/draft/2020-12). Tool {t.name!r}: {problem}.",
                param=where,
            )
        tools.append(Tool(name=t.name, description=t.description, parameters=t.input_schema))
    return out, tools


def parse(raw: Any) -> WireRequest:
    """The request in the proxy's terms.

    Raises:
        ProxyError: 400 naming what to fix.
    """
    body = validated(MessagesBody, raw, prefix="")
    messages, tools = _messages(body)
    choice = body.tool_choice or {"type": "auto"}
    kind = choice.get("type")
    tool_choice: str
    if kind == "auto":
        tool_choice = "auto"
    elif kind == "any":
        tool_choice = "required"
    elif kind == "none":
        tool_choice = "none"
    elif kind == "tool" and isinstance(choice.get("name"), str):
        tool_choice = choice["name"]
    else:
        raise ProxyError(400, "tool_choice.type must be auto, any, none or tool (with a name)", param="tool_choice")
    one_call = choice.get("disable_parallel_tool_use", False)
    if not isinstance(one_call, bool):
        raise ProxyError(
            400,
            "tool_choice.disable_parallel_tool_use must be true or false",
            param="tool_choice.disable_parallel_tool_use",
        )
    request = ChatRequest(
        model=body.model,
        messages=messages,
        tools=tools,
        tool_choice=tool_choice,
        sampling=Sampling(
            max_tokens=body.max_tokens,
            temperature=body.temperature,
            top_p=body.top_p,
            top_k=body.top_k,
            stop=list(body.stop_sequences or []),
        ),
        stream=bool(body.stream),
        parallel_tool_calls=not one_call,
        template_kwargs=template_kwargs.from_anthropic_thinking(body.thinking, max_tokens=body.max_tokens),
    )
    return WireRequest(request)


def parse_count(raw: Any) -> ChatRequest:
    body = validated(CountTokensBody, raw, prefix="")
    messages, tools = _messages(body)
    return ChatRequest(model=body.model, messages=messages, tools=tools)


def error_body(status: int, message: str, *, param: str | None = None, code: str | None = None) -> dict[str, Any]:
    kinds = {401: "authentication_error", 403: "permission_error", 404: "not_found_error", 429: "rate_limit_error"}
    kind = kinds.get(status, "invalid_request_error" if status < 500 else "api_error")
    if status in (503, 529):
        kind = "overloaded_error"
    if code == CONTEXT_LENGTH:
        # Claude Code compacts its history when it reads this phrase.
        message = f"prompt is too long: {message}"
    return {"type": "error", "error": {"type": kind, "message": message}}


def new_id() -> str:
    return f"msg_{secrets.token_hex(12)}"


def _usage(done: Finished) -> dict[str, Any]:
    usage: dict[str, Any] = {"input_tokens": done.usage.prompt_tokens, "output_tokens": done.usage.completion_tokens}
    if done.usage.cached_tokens is not None:
        usage["cache_read_input_tokens"] = done.usage.cached_tokens
    return usage


def _stop(done: Finished) -> tuple[str, str | None]:
    if done.reply.stop_string is not None:
        return "stop_sequence", done.reply.stop_string
    return _STOP_REASON[done.reply.finish_reason], None


def signature(thinking: str) -> str:
    """A thinking block's ``signature``: opaque to the harness (Anthropic's SDK requires one), here
    a digest of the thinking text, so an echoed block can be told unedited."""
    return hashlib.blake2b(thinking.encode(), digest_size=16).hexdigest()


def response(done: Finished, *, model: str, message_id: str) -> dict[str, Any]:
    content: list[dict[str, Any]] = []
    if done.reasoning:
        content.append({"type": "thinking", "thinking": done.reasoning, "signature": signature(done.reasoning)})
    if done.reply.content.strip() or not (done.reply.tool_calls or done.reasoning):
        content.append({"type": "text", "text": done.reply.content})
    for call in done.reply.tool_calls:
        content.append({"type": "tool_use", "id": call.id, "name": call.name, "input": json.loads(call.arguments)})
    stop_reason, stop_sequence = _stop(done)
    return {
        "id": message_id,
        "type": "message",
        "role": "assistant",
        "model": model,
        "content": content,
        "stop_reason": stop_reason,
        "stop_sequence": stop_sequence,
        "usage": _usage(done),
    }


def _event(name: str, data: dict[str, Any]) -> bytes:
    return f"event: {name}\ndata: {json.dumps({'type': name, **data}, ensure_ascii=False)}\n\n".encode()


async def stream(events: AsyncIterator[Event], *, model: str, message_id: str) -> AsyncIterator[bytes]:
    """Events as ``events`` come; the first is ``Started`` (the prompt's size for ``message_start``)."""
    first = await anext(events)
    prompt_tokens = first.prompt_tokens if isinstance(first, Started) else 0
    start: dict[str, Any] = {
        "id": message_id,
        "type": "message",
        "role": "assistant",
        "model": model,
        "content": [],
        "stop_reason": None,
        "stop_sequence": None,
        "usage": {"input_tokens": prompt_tokens, "output_tokens": 0},
    }
    yield _event("message_start", {"message": start})
    yield _event("ping", {})
    index = -1
    #: the block being written: "text", "thinking" (and its text so far, for its signature), or None.
    open_kind: str | None = None
    thinking = ""

    def close() -> list[bytes]:
        nonlocal open_kind
        out = []
        if open_kind == "thinking":
            delta = {"type": "signature_delta", "signature": signature(thinking)}
            out.append(_event("content_block_delta", {"index": index, "delta": delta}))
        if open_kind is not None:
            out.append(_event("content_block_stop", {"index": index}))
        open_kind = None
        return out

    def open_block(kind: str) -> list[bytes]:
        nonlocal index, open_kind, thinking
        if open_kind == kind:
            return []
        out = close()
        index += 1
        open_kind, thinking = kind, ""
        block = (
            {"type": "text", "text": ""} if kind == "text" else {"type": "thinking", "thinking": "", "signature": ""}
        )
        return [*out, _event("content_block_start", {"index": index, "content_block": block})]

    try:
        async for event in events:
            if isinstance(event, Started | Sampled):
                continue
            if isinstance(event, ReasoningDelta):
                for chunk in open_block("thinking"):
                    yield chunk
                thinking += event.text
                delta = {"type": "thinking_delta", "thinking": event.text}
                yield _event("content_block_delta", {"index": index, "delta": delta})
            elif isinstance(event, TextDelta):
                if not event.text:
                    continue
                for chunk in open_block("text"):
                    yield chunk
                yield _event(
                    "content_block_delta", {"index": index, "delta": {"type": "text_delta", "text": event.text}}
                )
            elif isinstance(event, ToolCallEvent):
                for chunk in close():
                    yield chunk
                index += 1
                block = {"type": "tool_use", "id": event.call.id, "name": event.call.name, "input": {}}
                yield _event("content_block_start", {"index": index, "content_block": block})
                delta = {"type": "input_json_delta", "partial_json": event.call.arguments}
                yield _event("content_block_delta", {"index": index, "delta": delta})
                yield _event("content_block_stop", {"index": index})
            else:
                for chunk in close():
                    yield chunk
                if index < 0:  # an empty answer still has its (empty) text block
                    yield _event("content_block_start", {"index": 0, "content_block": {"type": "text", "text": ""}})
                    yield _event("content_block_stop", {"index": 0})
                stop_reason, stop_sequence = _stop(event)
                end: dict[str, Any] = {"stop_reason": stop_reason, "stop_sequence": stop_sequence}
                yield _event("message_delta", {"delta": end, "usage": {"output_tokens": event.usage.completion_tokens}})
                yield _event("message_stop", {})
    except ProxyError as exc:
        yield _event("error", {"error": error_body(exc.status, exc.message, code=exc.code)["error"]})


class AnthropicMessagesFormat:
    """Anthropic Messages, a ``farm.proxy.wire.WireFormat``."""

    wire = WIRE
    call_id_prefix = CALL_ID_PREFIX

    def parse(self, raw: Any) -> WireRequest:
        return parse(raw)

    def new_id(self) -> str:
        return new_id()

    def response(self, done: Finished, answer: Answer) -> dict[str, Any]:
        return response(done, model=answer.model, message_id=answer.id)

    def stream(self, events: AsyncIterator[Event], answer: Answer) -> AsyncIterator[bytes]:
        return stream(events, model=answer.model, message_id=answer.id)

    def error_body(self, exc: ProxyError) -> dict[str, Any]:
        return error_body(exc.status, exc.message, param=exc.param, code=exc.code)
