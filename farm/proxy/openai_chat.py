"""OpenAI Chat Completions (``POST /v1/chat/completions``) and the OpenAI error shape.

Requests are read leniently (SDKs send fields the proxy has no use for: they are ignored), but a
field the proxy cannot honour without lying (``n`` > 1, image content) is a 400 that names it.
A reasoning model's reasoning is the message's ``reasoning_content`` (as vLLM returns it) and
streams as ``reasoning_content`` deltas before the content's.
Streaming follows the SDK's expectations: a first chunk with the role, content deltas, each tool
call as a chunk with its index, id and name then its arguments, a last chunk with
``finish_reason``, a usage chunk with empty ``choices`` only when ``stream_options.include_usage``
asks for it, and ``data: [DONE]``.
"""

from __future__ import annotations

import json
import secrets
import time
from collections.abc import AsyncIterator
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from farm.errors import ProxyError
from farm.proxy import template_kwargs
from farm.proxy.conversation import ChatRequest, Message, Sampling, Tool, ToolCall
from farm.proxy.errors import validated
from farm.proxy.events import Event, Finished, ReasoningDelta, Sampled, Started, TextDelta, ToolCallEvent, Usage
from farm.proxy.toolschema import check_function
from farm.proxy.wire import Answer, WireRequest

WIRE = "openai.chat"
#: OpenAI's bound on ``top_logprobs`` (Chat Completions and Responses alike).
MAX_TOP_LOGPROBS = 20


class _Function(BaseModel):
    model_config = ConfigDict(extra="allow")
    name: str
    arguments: str | dict[str, Any] = "{}"


class _ToolCallIn(BaseModel):
    model_config = ConfigDict(extra="allow")
    id: str
    type: str = "function"
    function: _Function


class _MessageIn(BaseModel):
    model_config = ConfigDict(extra="allow")
    role: str
    content: str | list[dict[str, Any]] | None = None
    tool_calls: list[_ToolCallIn] | None = None
    tool_call_id: str | None = None
    name: str | None = None


class _ToolIn(BaseModel):
    model_config = ConfigDict(extra="allow")
    type: str = "function"
    function: dict[str, Any]


class StreamOptions(BaseModel):
    model_config = ConfigDict(extra="allow")
    include_usage: bool | None = None


class ChatCompletionBody(BaseModel):
    model_config = ConfigDict(extra="allow")
    model: str | None = None
    messages: list[_MessageIn] = Field(min_length=1)
    tools: list[_ToolIn] | None = None
    tool_choice: str | dict[str, Any] | None = None
    parallel_tool_calls: bool | None = Field(default=None, strict=True)
    max_tokens: int | None = Field(default=None, ge=1)
    max_completion_tokens: int | None = Field(default=None, ge=1)
    temperature: float | None = Field(default=None, ge=0.0, le=2.0)
    top_p: float | None = Field(default=None, gt=0.0, le=1.0)
    top_k: int | None = None
    seed: int | None = None
    stop: str | list[str] | None = None
    logprobs: bool | None = None
    top_logprobs: int | None = Field(default=None, strict=True)
    n: int | None = None
    stream: bool | None = False
    stream_options: StreamOptions | None = None
    chat_template_kwargs: Any = None


def text_of(content: str | list[dict[str, Any]] | None, *, where: str) -> str:
    """A message's text: a string, or the text parts of a content list joined by newlines.

    Raises:
        ProxyError: a part that is not text (the policy reads text only).
    """
    if content is None or isinstance(content, str):
        return content or ""
    parts = []
    for part in content:
        kind = part.get("type")
        if kind in ("text", "input_text", "output_text") and isinstance(part.get("text"), str):
            parts.append(part["text"])
        else:
            raise ProxyError(400, f"{where}: content parts of type {kind!r} are not supported (text only)", param=where)
    return "\n".join(parts)


def parse(raw: Any) -> WireRequest:
    """The request in the proxy's terms, and whether the usage chunk was asked for.

    Raises:
        ProxyError: 400 naming the field to fix.
    """
    body = validated(ChatCompletionBody, raw)
    if body.n not in (None, 1):
        raise ProxyError(400, "n must be 1: the proxy samples one answer per request", param="n")
    top_logprobs = check_top_logprobs(body.top_logprobs)
    if body.top_logprobs is not None and not body.logprobs:
        raise ProxyError(
            400, "The 'top_logprobs' parameter is only allowed when 'logprobs' is enabled.", param="top_logprobs"
        )
    messages = []
    for i, m in enumerate(body.messages):
        role = "system" if m.role == "developer" else m.role
        if role not in ("system", "user", "assistant", "tool"):
            raise ProxyError(
                400,
                f"messages[{i}].role {m.role!r} is not one of system, developer, user, assistant, tool",
                param=f"messages[{i}].role",
            )
        if role == "tool" and not m.tool_call_id:
            raise ProxyError(400, f"messages[{i}] is a tool message without tool_call_id", param=f"messages[{i}]")
        calls = [
            ToolCall(
                id=c.id,
                name=c.function.name,
                arguments=c.function.arguments
                if isinstance(c.function.arguments, str)
                else json.dumps(c.function.arguments),
            )
            for c in m.tool_calls or []
        ]
        messages.append(
            Message(
                role=role,
                content=text_of(m.content, where=f"messages[{i}].content"),
                tool_calls=calls,
                tool_call_id=m.tool_call_id,
                name=m.name if role == "tool" else None,
            )
        )
    tools = []
    for i, t in enumerate(body.tools or []):
        fn = t.function
        if t.type != "function" or not isinstance(fn.get("name"), str):
            raise ProxyError(
                400, f"tools[{i}] must be {{'type': 'function', 'function': {{'name': ...}}}}", param=f"tools[{i}]"
            )
        parameters = {} if fn.get("parameters") is None else fn["parameters"]
        check_function(parameters, name=fn["name"], param=f"tools[{i}].function.parameters")
        tools.append(Tool(name=fn["name"], description=fn.get("description"), parameters=parameters))
    choice = body.tool_choice or "auto"
    if isinstance(choice, dict):
        name = (choice.get("function") or {}).get("name")
        if not isinstance(name, str):
            raise ProxyError(
                400,
                "tool_choice must be auto, none, required or {'type': 'function', 'function': {'name': ...}}",
                param="tool_choice",
            )
        choice = name
    elif choice not in ("auto", "none", "required"):
        raise ProxyError(400, f"tool_choice {choice!r} is not auto, none or required", param="tool_choice")
    stop = [body.stop] if isinstance(body.stop, str) else list(body.stop or [])
    request = ChatRequest(
        model=body.model,
        messages=messages,
        tools=tools,
        tool_choice=choice,
        sampling=Sampling(
            max_tokens=body.max_completion_tokens or body.max_tokens,
            max_tokens_field="max_completion_tokens" if body.max_completion_tokens else "max_tokens",
            temperature=body.temperature,
            top_p=body.top_p,
            top_k=body.top_k,
            seed=body.seed,
            stop=stop,
        ),
        parallel_tool_calls=body.parallel_tool_calls is not False,
        stream=bool(body.stream),
        logprobs=bool(body.logprobs),
        top_logprobs=top_logprobs,
        template_kwargs=template_kwargs.check(body.chat_template_kwargs),
    )
    include_usage = bool(body.stream_options and body.stream_options.include_usage)
    return WireRequest(request, include_usage=include_usage)


def check_top_logprobs(value: int | None) -> int:
    """``top_logprobs`` as OpenAI bounds it (None: 0).

    Raises:
        ProxyError: 400 naming ``top_logprobs`` when it is outside 0..20.
    """
    if value is None:
        return 0
    if value < 0:
        raise ProxyError(
            400,
            f"Invalid 'top_logprobs': integer below minimum value. Expected a value >= 0, but got {value} instead.",
            param="top_logprobs",
            code="integer_below_min_value",
        )
    if value > MAX_TOP_LOGPROBS:
        raise ProxyError(
            400,
            f"Invalid 'top_logprobs': integer above maximum value. Expected a value <= {MAX_TOP_LOGPROBS}, "
            f"but got {value} instead.",
            param="top_logprobs",
            code="integer_above_max_value",
        )
    return value


def token_logprobs(done: Finished | Sampled) -> list[dict[str, Any]]:
    """One ``{token, logprob, bytes, top_logprobs}`` per sampled token (Chat Completions' and
    Responses' shape); ``top_logprobs`` lists ``{token, logprob, bytes}``, most likely first."""
    tops = done.top_logprobs
    return [
        {
            "token": text,
            "logprob": lp,
            "bytes": list(text.encode()),
            "top_logprobs": [
                {"token": t, "logprob": v, "bytes": list(t.encode())} for t, v in (tops[i] if i < len(tops) else [])
            ],
        }
        for i, (text, lp) in enumerate(zip(done.token_texts, done.logprobs, strict=True))
    ]


def _arguments(value: str | dict[str, Any]) -> str:
    return value if isinstance(value, str) else json.dumps(value, ensure_ascii=False)


def error_body(status: int, message: str, *, param: str | None = None, code: str | None = None) -> dict[str, Any]:
    kind = {401: "authentication_error", 403: "permission_error", 404: "not_found_error", 429: "rate_limit_error"}
    err_type = kind.get(status, "invalid_request_error" if status < 500 else "server_error")
    return {"error": {"message": message, "type": err_type, "param": param, "code": code}}


def usage_body(usage: Usage) -> dict[str, Any]:
    out: dict[str, Any] = {
        "prompt_tokens": usage.prompt_tokens,
        "completion_tokens": usage.completion_tokens,
        "total_tokens": usage.total_tokens,
    }
    if usage.cached_tokens is not None:
        out["prompt_tokens_details"] = {"cached_tokens": usage.cached_tokens}
    if usage.reasoning_tokens is not None:  # as vLLM: only where a reasoning parser reads the answers
        out["completion_tokens_details"] = {"reasoning_tokens": usage.reasoning_tokens}
    return out


def _logprobs(done: Finished) -> dict[str, Any]:
    return {"content": token_logprobs(done), "refusal": None}


def _tool_calls(calls: list[ToolCall]) -> list[dict[str, Any]]:
    return [{"id": c.id, "type": "function", "function": {"name": c.name, "arguments": c.arguments}} for c in calls]


def new_id() -> str:
    return f"chatcmpl-{secrets.token_hex(12)}"


def response(done: Finished, *, model: str, completion_id: str, logprobs: bool) -> dict[str, Any]:
    reply = done.reply
    message: dict[str, Any] = {
        "role": "assistant",
        "content": reply.content if reply.content.strip() or not reply.tool_calls else None,
        "refusal": None,
    }
    if done.reasoning:
        message["reasoning_content"] = done.reasoning
    if reply.tool_calls:
        message["tool_calls"] = _tool_calls(reply.tool_calls)
    return {
        "id": completion_id,
        "object": "chat.completion",
        "created": int(time.time()),
        "model": model,
        "choices": [
            {
                "index": 0,
                "message": message,
                "logprobs": _logprobs(done) if logprobs else None,
                "finish_reason": reply.finish_reason,
            }
        ],
        "usage": usage_body(done.usage),
        "system_fingerprint": None,
    }


def sse(data: dict[str, Any] | str) -> bytes:
    text = data if isinstance(data, str) else json.dumps(data, separators=(",", ":"), ensure_ascii=False)
    return f"data: {text}\n\n".encode()


async def stream(
    events: AsyncIterator[Event], *, model: str, completion_id: str, include_usage: bool, logprobs: bool
) -> AsyncIterator[bytes]:
    """Chunks as ``events`` come. An error after the first chunk ends the stream with an error event.

    With ``logprobs``, each content chunk carries the logprobs of the tokens sampled since the last
    chunk that carried any (a token's text may be held back a little by the stop matcher or the
    tool-call parser: its logprob goes with the next text out), and the finish chunk the rest.
    """
    created = int(time.time())
    pending: list[dict[str, Any]] = []

    def take() -> dict[str, Any] | None:
        if not logprobs:
            return None
        content = pending[:]
        pending.clear()
        return {"content": content, "refusal": None}

    def chunk(delta: dict[str, Any], finish: str | None = None, **extra: Any) -> bytes:
        body: dict[str, Any] = {
            "id": completion_id,
            "object": "chat.completion.chunk",
            "created": created,
            "model": model,
            "system_fingerprint": None,
            "choices": [{"index": 0, "delta": delta, "logprobs": extra.get("logprobs"), "finish_reason": finish}],
        }
        if include_usage:
            body["usage"] = None
        return sse(body)

    yield chunk({"role": "assistant", "content": ""})
    try:
        async for event in events:
            if isinstance(event, Started):
                continue
            if isinstance(event, Sampled):
                pending.extend(token_logprobs(event))
            elif isinstance(event, ReasoningDelta):
                yield chunk({"reasoning_content": event.text})
            elif isinstance(event, TextDelta):
                if event.text:
                    yield chunk({"content": event.text}, logprobs=take())
            elif isinstance(event, ToolCallEvent):
                head = {
                    "index": event.index,
                    "id": event.call.id,
                    "type": "function",
                    "function": {"name": event.call.name, "arguments": ""},
                }
                yield chunk({"tool_calls": [head]})
                yield chunk({"tool_calls": [{"index": event.index, "function": {"arguments": event.call.arguments}}]})
            else:
                yield chunk({}, event.reply.finish_reason, logprobs=take())
                if include_usage:
                    yield sse(
                        {
                            "id": completion_id,
                            "object": "chat.completion.chunk",
                            "created": created,
                            "model": model,
                            "system_fingerprint": None,
                            "choices": [],
                            "usage": usage_body(event.usage),
                        }
                    )
    except ProxyError as exc:
        yield sse(error_body(exc.status, exc.message, param=exc.param, code=exc.code))
        return
    yield sse("[DONE]")


class OpenAIChatFormat:
    """OpenAI Chat Completions, a ``farm.proxy.wire.WireFormat``."""

    wire = WIRE
    call_id_prefix = "call_"

    def parse(self, raw: Any) -> WireRequest:
        return parse(raw)

    def new_id(self) -> str:
        return new_id()

    def response(self, done: Finished, answer: Answer) -> dict[str, Any]:
        return response(done, model=answer.model, completion_id=answer.id, logprobs=answer.request.call.logprobs)

    def stream(self, events: AsyncIterator[Event], answer: Answer) -> AsyncIterator[bytes]:
        request = answer.request
        return stream(
            events,
            model=answer.model,
            completion_id=answer.id,
            include_usage=request.include_usage,
            logprobs=request.call.logprobs,
        )

    def error_body(self, exc: ProxyError) -> dict[str, Any]:
        return error_body(exc.status, exc.message, param=exc.param, code=exc.code)
