"""OpenAI Responses (``POST /v1/responses``), as Codex CLI and the openai SDK's ``responses`` speak it.

The proxy is stateless per request, as a trainer needs it to be: the whole conversation comes in
``input`` (``previous_response_id`` is a 400 saying so; ``store`` is ignored). Input items map onto
the proxy's conversation: messages (text parts), ``function_call`` items (the model's tool calls,
matched by ``call_id``) and ``function_call_output`` items (tool messages). ``reasoning`` items are
dropped (the model's reasoning is never part of the reply the proxy gave). ``instructions`` is the
system message. Only function tools are offered to the model; built-in tool types (web search,
hosted tool namespaces) are left out, since the policy's template has no way to render them.

Streaming is the SDK's named events, each with a ``sequence_number``: ``response.created``,
``response.in_progress``, per output item ``response.output_item.added`` (and for text
``response.content_part.added``, ``response.output_text.delta``..., ``response.output_text.done``,
``response.content_part.done``; for a reasoning model's ``reasoning`` item the same with
``response.reasoning_text.delta``/``.done``; for a call ``response.function_call_arguments.delta``/``.done``),
``response.output_item.done``, and ``response.completed``; a failure is ``response.failed``.
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
from farm.proxy.events import Event, Finished, ReasoningDelta, Sampled, Started, TextDelta, ToolCallEvent
from farm.proxy.openai_chat import check_top_logprobs, error_body, text_of, token_logprobs
from farm.proxy.toolschema import check_function
from farm.proxy.wire import Answer, WireRequest

WIRE = "openai.responses"
CALL_ID_PREFIX = "call_"
#: the ``include`` entry that asks for the message text's logprobs.
INCLUDE_LOGPROBS = "message.output_text.logprobs"


class ResponsesBody(BaseModel):
    model_config = ConfigDict(extra="allow")
    model: str | None = None
    input: str | list[dict[str, Any]]
    instructions: str | None = None
    tools: list[dict[str, Any]] | None = None
    tool_choice: str | dict[str, Any] | None = None
    parallel_tool_calls: bool | None = Field(default=None, strict=True)
    max_output_tokens: int | None = Field(default=None, ge=1)
    temperature: float | None = Field(default=None, ge=0.0, le=2.0)
    top_p: float | None = Field(default=None, gt=0.0, le=1.0)
    stream: bool | None = False
    previous_response_id: str | None = None
    include: list[str] | None = None
    top_logprobs: int | None = Field(default=None, strict=True)
    reasoning: Any = None


def parse(raw: Any) -> WireRequest:
    """The request in the proxy's terms, and what of it the response repeats (its tools, tool
    choice and parallel calls, as the request gave them).

    Raises:
        ProxyError: 400 naming what to fix.
    """
    body = validated(ResponsesBody, raw)
    if body.previous_response_id:
        raise ProxyError(
            400,
            "previous_response_id is not supported: the proxy keeps no response state; send the whole input",
            param="previous_response_id",
        )
    messages: list[Message] = []
    if body.instructions:
        messages.append(Message(role="system", content=body.instructions))
    items = [{"type": "message", "role": "user", "content": body.input}] if isinstance(body.input, str) else body.input
    for i, item in enumerate(items):
        kind = item.get("type", "message")
        where = f"input[{i}]"
        if kind == "message":
            role = {"developer": "system"}.get(str(item.get("role")), str(item.get("role")))
            if role not in ("system", "user", "assistant"):
                raise ProxyError(400, f"{where}.role must be system, developer, user or assistant", param=where)
            text = text_of(item.get("content"), where=f"{where}.content")
            if role == "assistant" and messages and messages[-1].role == "assistant":
                # One response's items are one turn: a streamed answer gives the text the model
                # wrote after a call as a message item of its own, which joins the turn's text.
                messages[-1] = messages[-1].model_copy(update={"content": messages[-1].content + text})
            else:
                messages.append(Message(role=role, content=text))
        elif kind == "function_call":
            if not isinstance(item.get("name"), str) or not item["name"]:
                raise ProxyError(400, f"{where}: a function_call needs its name", param=f"{where}.name")
            call = ToolCall(id=_call_id(item, where), name=item["name"], arguments=str(item.get("arguments") or "{}"))
            # The model's calls of one turn, and its text before them, are one assistant message.
            if messages and messages[-1].role == "assistant":
                last = messages[-1]
                messages[-1] = last.model_copy(update={"tool_calls": [*last.tool_calls, call]})
            else:
                messages.append(Message(role="assistant", tool_calls=[call]))
        elif kind == "function_call_output":
            output = item.get("output")
            text = output if isinstance(output, str) else text_of(output, where=f"{where}.output")
            messages.append(Message(role="tool", content=text, tool_call_id=_call_id(item, where)))
        elif kind == "reasoning":
            continue
        else:
            raise ProxyError(400, f"{where}: input items of type {kind!r} are not supported", param=where)
    tools = []
    for i, tool in enumerate(body.tools or []):
        if tool.get("type") != "function":
            # Built-in tools (web search, namespaces of hosted tools) have no meaning to the policy's
            # template: they are not offered. Codex sends some with its function tools.
            continue
        if not isinstance(tool.get("name"), str):
            raise ProxyError(400, f"tools[{i}]: a function tool needs a name", param=f"tools[{i}]")
        parameters = {} if tool.get("parameters") is None else tool["parameters"]
        check_function(parameters, name=tool["name"], param=f"tools[{i}].parameters")
        tools.append(Tool(name=tool["name"], description=tool.get("description"), parameters=parameters))
    choice = body.tool_choice or "auto"
    if isinstance(choice, dict):
        if choice.get("type") != "function" or not isinstance(choice.get("name"), str):
            # A forced built-in tool (web search...) cannot be met: those tools are not offered.
            raise ProxyError(
                400,
                "tool_choice must be auto, none, required or {'type': 'function', 'name': ...}",
                param="tool_choice",
            )
        choice = choice["name"]
    elif choice not in ("auto", "none", "required"):
        raise ProxyError(400, f"tool_choice {choice!r} is not auto, none or required", param="tool_choice")
    top_logprobs = check_top_logprobs(body.top_logprobs)
    echo = {
        "parallel_tool_calls": body.parallel_tool_calls is not False,
        "tool_choice": body.tool_choice or "auto",
        "tools": body.tools or [],
    }
    request = ChatRequest(
        model=body.model,
        messages=messages,
        tools=tools,
        tool_choice=choice,
        sampling=Sampling(
            max_tokens=body.max_output_tokens,
            max_tokens_field="max_output_tokens",
            temperature=body.temperature,
            top_p=body.top_p,
        ),
        stream=bool(body.stream),
        parallel_tool_calls=body.parallel_tool_calls is not False,
        logprobs=INCLUDE_LOGPROBS in (body.include or []),
        top_logprobs=top_logprobs,
        template_kwargs=template_kwargs.from_responses_reasoning(body.reasoning),
    )
    return WireRequest(request, echo=echo)


def _call_id(item: dict[str, Any], where: str) -> str:
    """Raises ProxyError: the item has no ``call_id`` (the id that ties a call to its output)."""
    call_id = item.get("call_id")
    if not isinstance(call_id, str) or not call_id:
        raise ProxyError(400, f"{where}: a {item.get('type')} item needs its call_id", param=f"{where}.call_id")
    return call_id


def for_input(exc: ProxyError) -> ProxyError:
    """An error about the messages names ``input``, the field a Responses request sends them in."""
    if exc.param == "messages":
        exc.param = "input"
        exc.message = exc.message.replace("messages must not be empty", "input must not be empty")
    return exc


def new_id() -> str:
    return f"resp_{secrets.token_hex(12)}"


def _usage(done: Finished) -> dict[str, Any]:
    return {
        "input_tokens": done.usage.prompt_tokens,
        "input_tokens_details": {"cached_tokens": done.usage.cached_tokens or 0},
        "output_tokens": done.usage.completion_tokens,
        "output_tokens_details": {"reasoning_tokens": done.usage.reasoning_tokens or 0},
        "total_tokens": done.usage.total_tokens,
    }


def _message_item(item_id: str, text: str, status: str, logprobs: list[dict[str, Any]] | None = None) -> dict[str, Any]:
    content = [_text_part(text, logprobs)] if status == "completed" else []
    return {"type": "message", "id": item_id, "role": "assistant", "status": status, "content": content}


def _text_part(text: str, logprobs: list[dict[str, Any]] | None) -> dict[str, Any]:
    part: dict[str, Any] = {"type": "output_text", "text": text, "annotations": []}
    if logprobs is not None:
        part["logprobs"] = logprobs
    return part


def _logprobs(done: Finished, logprobs: bool) -> list[dict[str, Any]] | None:
    # Every sampled token's, on the reply's text (the proxy does not split them between text and calls).
    return token_logprobs(done) if logprobs else None


def _reasoning_item(item_id: str, text: str, status: str) -> dict[str, Any]:
    """A reasoning model's reasoning, as vLLM returns it: its text as ``reasoning_text`` content."""
    content = [{"type": "reasoning_text", "text": text}] if status == "completed" else []
    return {"type": "reasoning", "id": item_id, "summary": [], "content": content, "status": status}


def _call_item(item_id: str, call: ToolCall, status: str) -> dict[str, Any]:
    arguments = call.arguments if status == "completed" else ""
    return {
        "type": "function_call",
        "id": item_id,
        "call_id": call.id,
        "name": call.name,
        "arguments": arguments,
        "status": status,
    }


def _response(
    response_id: str,
    model: str,
    created: int,
    status: str,
    output: list[dict[str, Any]],
    done: Finished | None,
    echo: dict[str, Any],
) -> dict[str, Any]:
    incomplete = done is not None and done.reply.finish_reason == "length"
    return {
        "id": response_id,
        "object": "response",
        "created_at": created,
        "status": "incomplete" if incomplete else status,
        "incomplete_details": {"reason": "max_output_tokens"} if incomplete else None,
        "model": model,
        "output": output,
        **echo,
        "error": None,
        "usage": _usage(done) if done is not None else None,
    }


def response(
    done: Finished, *, model: str, response_id: str, echo: dict[str, Any], logprobs: bool = False
) -> dict[str, Any]:
    output: list[dict[str, Any]] = []
    if done.reasoning:
        output.append(_reasoning_item(f"rs_{secrets.token_hex(12)}", done.reasoning, "completed"))
    if done.reply.content.strip() or not done.reply.tool_calls:
        lps = _logprobs(done, logprobs)
        output.append(_message_item(f"msg_{secrets.token_hex(12)}", done.reply.content, "completed", lps))
    output += [_call_item(f"fc_{secrets.token_hex(12)}", c, "completed") for c in done.reply.tool_calls]
    return _response(response_id, model, int(time.time()), "completed", output, done, echo)


async def stream(
    events: AsyncIterator[Event], *, model: str, response_id: str, echo: dict[str, Any], logprobs: bool = False
) -> AsyncIterator[bytes]:
    """The SDK's named events. With ``logprobs``, each text delta carries the logprobs of the tokens
    sampled since the last one, and the whole list (every sampled token's, known once the call is
    recorded) comes with the text's ``done`` events when the text ends there, and on the message
    item of ``response.completed`` (or ``.incomplete``) in any case."""
    created = int(time.time())
    seq = 0

    def emit(name: str, data: dict[str, Any]) -> bytes:
        nonlocal seq
        seq += 1
        payload = {"type": name, "sequence_number": seq - 1, **data}
        return f"event: {name}\ndata: {json.dumps(payload, ensure_ascii=False)}\n\n".encode()

    yield emit("response.created", {"response": _response(response_id, model, created, "in_progress", [], None, echo)})
    yield emit(
        "response.in_progress", {"response": _response(response_id, model, created, "in_progress", [], None, echo)}
    )
    output: list[dict[str, Any]] = []
    text_id: str | None = None
    text = ""
    #: logprobs of tokens sampled since the last text delta (streamed calls that asked for them).
    pending: list[dict[str, Any]] = []

    def close_text(done: Finished | None = None) -> list[bytes]:
        nonlocal text_id, text
        if text_id is None:
            return []
        index = len(output)
        lps = _logprobs(done, logprobs) if done is not None else None
        part = _text_part(text, lps)
        item = _message_item(text_id, text, "completed", lps)
        out = [
            emit(
                "response.output_text.done",
                {"item_id": text_id, "output_index": index, "content_index": 0, "text": text, "logprobs": lps or []},
            ),
            emit(
                "response.content_part.done",
                {"item_id": text_id, "output_index": index, "content_index": 0, "part": part},
            ),
            emit("response.output_item.done", {"output_index": index, "item": item}),
        ]
        output.append(item)
        text_id, text = None, ""
        return out

    reasoning_id: str | None = None
    reasoning = ""

    def close_reasoning() -> list[bytes]:
        nonlocal reasoning_id, reasoning
        if reasoning_id is None:
            return []
        index, item = len(output), _reasoning_item(reasoning_id, reasoning, "completed")
        where = {"item_id": reasoning_id, "output_index": index, "content_index": 0}
        out = [
            emit("response.reasoning_text.done", {**where, "text": reasoning}),
            emit("response.content_part.done", {**where, "part": item["content"][0]}),
            emit("response.output_item.done", {"output_index": index, "item": item}),
        ]
        output.append(item)
        reasoning_id, reasoning = None, ""
        return out

    try:
        async for event in events:
            if isinstance(event, Started):
                continue
            if isinstance(event, Sampled):
                pending.extend(token_logprobs(event))
            elif isinstance(event, ReasoningDelta):
                for chunk in close_text():
                    yield chunk
                if reasoning_id is None:
                    reasoning_id = f"rs_{secrets.token_hex(12)}"
                    where = {"item_id": reasoning_id, "output_index": len(output), "content_index": 0}
                    added = _reasoning_item(reasoning_id, "", "in_progress")
                    yield emit("response.output_item.added", {"output_index": len(output), "item": added})
                    yield emit("response.content_part.added", {**where, "part": {"type": "reasoning_text", "text": ""}})
                reasoning += event.text
                where = {"item_id": reasoning_id, "output_index": len(output), "content_index": 0}
                yield emit("response.reasoning_text.delta", {**where, "delta": event.text})
            elif isinstance(event, TextDelta):
                if not event.text:
                    continue
                for chunk in close_reasoning():
                    yield chunk
                if text_id is None:
                    text_id = f"msg_{secrets.token_hex(12)}"
                    index = len(output)
                    yield emit(
                        "response.output_item.added",
                        {"output_index": index, "item": _message_item(text_id, "", "in_progress")},
                    )
                    part = {"type": "output_text", "text": "", "annotations": []}
                    yield emit(
                        "response.content_part.added",
                        {"item_id": text_id, "output_index": index, "content_index": 0, "part": part},
                    )
                text += event.text
                delta = {"item_id": text_id, "output_index": len(output), "content_index": 0, "delta": event.text}
                yield emit("response.output_text.delta", {**delta, "logprobs": pending[:]})
                pending.clear()
            elif isinstance(event, ToolCallEvent):
                for chunk in [*close_reasoning(), *close_text()]:
                    yield chunk
                item_id, index = f"fc_{secrets.token_hex(12)}", len(output)
                yield emit(
                    "response.output_item.added",
                    {"output_index": index, "item": _call_item(item_id, event.call, "in_progress")},
                )
                yield emit(
                    "response.function_call_arguments.delta",
                    {"item_id": item_id, "output_index": index, "delta": event.call.arguments},
                )
                yield emit(
                    "response.function_call_arguments.done",
                    {"item_id": item_id, "output_index": index, "arguments": event.call.arguments},
                )
                item = _call_item(item_id, event.call, "completed")
                yield emit("response.output_item.done", {"output_index": index, "item": item})
                output.append(item)
            else:
                for chunk in [*close_reasoning(), *close_text(event)]:
                    yield chunk
                if logprobs:
                    _attach_logprobs(output, _logprobs(event, logprobs))
                final = _response(response_id, model, created, "completed", output, event, echo)
                name = "response.incomplete" if final["status"] == "incomplete" else "response.completed"
                yield emit(name, {"response": final})
    except ProxyError as exc:
        failed = _response(response_id, model, created, "failed", output, None, echo)
        failed["error"] = {"code": exc.code or "server_error", "message": exc.message}
        yield emit("response.failed", {"response": failed})


def _attach_logprobs(output: list[dict[str, Any]], logprobs: list[dict[str, Any]] | None) -> None:
    """The logprobs on the last message item's text (closed before a tool call, it went out without)."""
    for item in reversed(output):
        if item["type"] == "message" and item["content"]:
            item["content"][0]["logprobs"] = logprobs
            return


__all__ = ["WIRE", "OpenAIResponsesFormat", "error_body", "new_id", "parse", "response", "stream"]


class OpenAIResponsesFormat:
    """OpenAI Responses, a ``farm.proxy.wire.WireFormat``."""

    wire = WIRE
    call_id_prefix = CALL_ID_PREFIX

    def parse(self, raw: Any) -> WireRequest:
        return parse(raw)

    def new_id(self) -> str:
        return new_id()

    def response(self, done: Finished, answer: Answer) -> dict[str, Any]:
        request = answer.request
        return response(
            done, model=answer.model, response_id=answer.id, echo=request.echo, logprobs=request.call.logprobs
        )

    def stream(self, events: AsyncIterator[Event], answer: Answer) -> AsyncIterator[bytes]:
        request = answer.request
        return stream(
            events, model=answer.model, response_id=answer.id, echo=request.echo, logprobs=request.call.logprobs
        )

    def error_body(self, exc: ProxyError) -> dict[str, Any]:
        exc = for_input(exc)
        return error_body(exc.status, exc.message, param=exc.param, code=exc.code)
