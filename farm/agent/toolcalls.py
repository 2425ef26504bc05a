"""The text format of tool calls, and of their observations.

A model calls a tool by writing, anywhere in its turn, one or more blocks::

    <tool_call>{"name": "bash", "arguments": {"command": "ls"}}</tool_call>

Each block holds one JSON object with a string ``name`` and an object ``arguments`` (which
may be omitted when the tool takes none). Text outside the blocks is the model's prose. The
loop answers every call with a ``<tool_response>`` block (``format_response``).

``parse_tool_calls`` never raises: problems come back as ``ToolCallError`` entries whose
``message`` is written for the model, so the loop can send it back as an observation
(a malformed call is the policy's mistake, not a crash). Arguments are checked against a
JSON-schema-like spec, the OpenAI function shape: ``{"name", "description", "parameters":
{"type": "object", "properties": {...}, "required": [...]}}``. Only the keywords that
matter for a tool call are checked: ``type``, ``enum``, ``required``, and unknown
arguments (refused unless ``additionalProperties`` is true).
"""

from __future__ import annotations

import html
import json
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

OPEN_TAG = "<tool_call>"
CLOSE_TAG = "</tool_call>"
RESPONSE_CLOSE_TAG = "</tool_response>"
#: calls accepted per turn; more is almost always a degenerate loop of the policy.
MAX_CALLS_PER_TURN = 16
#: longest call body echoed back in an error message.
MAX_ECHO_CHARS = 200

_JSON_TYPES: dict[str, tuple[type, ...]] = {
    "string": (str,),
    "integer": (int,),
    "number": (int, float),
    "boolean": (bool,),
    "array": (list,),
    "object": (dict,),
    "null": (type(None),),
}
_TAG = re.compile(r"<(/?)tool_call>")
_LANGUAGE_TAG = re.compile(r"[A-Za-z0-9_+-]{0,20}")
FENCE = "`" * 3


@dataclass(frozen=True)
class ToolCall:
    """One well-formed call. ``index`` is its position among the turn's blocks; ``id`` the call id
    its tool result answers (given by the loop's reader, ``farm.agent.turns``)."""

    name: str
    arguments: dict[str, Any]
    index: int
    id: str = ""


@dataclass(frozen=True)
class ToolCallError:
    """One block (or the turn) that could not be turned into a call. ``kind`` is machine-readable."""

    kind: str
    message: str
    index: int | None = None
    name: str | None = None
    #: the id of the call it is about, where the model's call was read as one.
    call_id: str | None = None


@dataclass(frozen=True)
class ParsedTurn:
    """Everything found in one model turn: valid calls, errors, and the prose around the blocks."""

    calls: list[ToolCall] = field(default_factory=list)
    errors: list[ToolCallError] = field(default_factory=list)
    text: str = ""

    @property
    def ok(self) -> bool:
        return not self.errors


def _short(body: str) -> str:
    body = body.strip()
    return body if len(body) <= MAX_ECHO_CHARS else body[:MAX_ECHO_CHARS] + "..."


def _type_ok(value: Any, expected: Any) -> bool:
    names = expected if isinstance(expected, list) else [expected]
    for name in names:
        kinds = _JSON_TYPES.get(name) if isinstance(name, str) else None
        if kinds is None:
            return True  # an unknown type keyword is the spec author's business, not the model's
        # bool is an int subclass in Python, never a JSON number.
        if isinstance(value, bool) and name in ("integer", "number"):
            continue
        if name == "integer" and isinstance(value, float) and value.is_integer():
            return True
        if isinstance(value, kinds):
            return True
    return False


def check_arguments(spec: Mapping[str, Any], arguments: Mapping[str, Any]) -> list[str]:
    """Problems of ``arguments`` against a tool spec, one sentence each (empty when valid)."""
    params = spec.get("parameters") or {}
    properties: Mapping[str, Any] = params.get("properties") or {}
    required: Sequence[str] = params.get("required") or []
    problems = [f"missing required argument {name!r}" for name in required if name not in arguments]
    if params.get("additionalProperties") is not True:
        extra = sorted(set(arguments) - set(properties))
        if extra:
            allowed = ", ".join(sorted(properties)) or "none"
            problems.append(f"unknown argument(s) {', '.join(map(repr, extra))} (allowed: {allowed})")
    for name, value in arguments.items():
        prop = properties.get(name)
        if not isinstance(prop, Mapping):
            continue
        if "type" in prop and not _type_ok(value, prop["type"]):
            problems.append(f"argument {name!r} must be of type {prop['type']}, got {type(value).__name__}")
        elif "enum" in prop and value not in prop["enum"]:
            problems.append(f"argument {name!r} must be one of {prop['enum']!r}")
    return problems


def _strip_fence(body: str) -> str:
    """Drop a Markdown fence around the JSON (models often add one inside the tags).

    Plain string operations: a regex for this backtracks badly on long whitespace runs.
    """
    stripped = body.strip()
    if len(stripped) < 6 or not (stripped.startswith(FENCE) and stripped.endswith(FENCE)):
        return body
    inner = stripped[3:-3]
    first_line, newline, rest = inner.partition("\n")
    return rest if newline and _LANGUAGE_TAG.fullmatch(first_line.strip()) else inner


def _parse_block(body: str, index: int, tools: Mapping[str, Mapping[str, Any]] | None) -> ToolCall | ToolCallError:
    body = _strip_fence(body)
    try:
        obj = json.loads(body)
    except (ValueError, RecursionError) as exc:
        where = f" ({exc.msg} at position {exc.pos})" if isinstance(exc, json.JSONDecodeError) else ""
        return ToolCallError(
            "bad_json",
            f"tool call {index} is not valid JSON{where}: {_short(body)!r}. "
            'Write {"name": ..., "arguments": {...}} with double-quoted keys.',
            index,
        )
    if not isinstance(obj, dict):
        return ToolCallError(
            "bad_shape", f'tool call {index} must be a JSON object {{"name": ..., "arguments": ...}}', index
        )
    name = obj.get("name")
    if not isinstance(name, str) or not name:
        return ToolCallError("bad_shape", f'tool call {index} needs a string "name"', index)
    arguments = obj.get("arguments", {})
    if isinstance(arguments, str):
        # Some models double-encode the arguments object, as OpenAI's wire format does.
        try:
            arguments = json.loads(arguments)
        except (ValueError, RecursionError):
            pass
    if not isinstance(arguments, dict):
        return ToolCallError("bad_shape", f'tool call {index} ({name}): "arguments" must be a JSON object', index, name)
    extra_keys = sorted(set(obj) - {"name", "arguments"})
    if extra_keys:
        return ToolCallError(
            "bad_shape",
            f'tool call {index} ({name}) has unexpected key(s) {extra_keys}: put parameters inside "arguments"',
            index,
            name,
        )
    return check_call(name, arguments, index, tools)


def check_call(
    name: str,
    arguments: dict[str, Any],
    index: int,
    tools: Mapping[str, Mapping[str, Any]] | None,
    *,
    call_id: str = "",
) -> ToolCall | ToolCallError:
    """A call read from the model's turn, checked against ``tools`` (by name; None accepts any call):
    an unknown tool or arguments that do not fit its spec come back as the error the model reads."""
    if tools is not None:
        spec = tools.get(name)
        if spec is None:
            known = ", ".join(sorted(tools)) or "none"
            return ToolCallError(
                "unknown_tool", f"unknown tool {name!r}; available tools: {known}", index, name, call_id or None
            )
        problems = check_arguments(spec, arguments)
        if problems:
            message = f"tool call {index} ({name}): " + "; ".join(problems)
            return ToolCallError("bad_arguments", message, index, name, call_id or None)
    return ToolCall(name=name, arguments=arguments, index=index, id=call_id)


def parse_tool_calls(
    text: str, tools: Sequence[Mapping[str, Any]] | None = None, *, first_index: int = 0
) -> ParsedTurn:
    """Find every ``<tool_call>`` block of a model turn; never raises.

    Args:
        text: the model's decoded turn.
        tools: tool specs to check names and arguments against; None accepts any call.
        first_index: the index of the first block (the text is part of a turn with calls before it).
    """
    try:
        return _parse(text, tools, first_index)
    except Exception as exc:  # noqa: BLE001 - the contract is "never raises": report, don't crash the loop
        return ParsedTurn(errors=[ToolCallError("internal", f"the tool call could not be read ({type(exc).__name__})")])


def _parse(text: str, tools: Sequence[Mapping[str, Any]] | None, first_index: int) -> ParsedTurn:
    by_name = None if tools is None else {str(t.get("name")): t for t in tools}
    calls: list[ToolCall] = []
    errors: list[ToolCallError] = []
    prose: list[str] = []
    pos, index = 0, first_index
    while True:
        match = _TAG.search(text, pos)
        if match is None:
            prose.append(text[pos:])
            break
        if len(calls) + len(errors) >= MAX_CALLS_PER_TURN:
            errors.append(ToolCallError("too_many_calls", f"at most {MAX_CALLS_PER_TURN} tool calls per turn", index))
            break
        if match.group(1):  # a closing tag with no opening one
            prose.append(text[pos : match.start()])
            errors.append(ToolCallError("unopened_tag", f"found {CLOSE_TAG} without a matching {OPEN_TAG}", index))
            pos = match.end()
            continue
        prose.append(text[pos : match.start()])
        body_start = match.end()
        close = _TAG.search(text, body_start)
        if close is None or not close.group(1):
            end = len(text) if close is None else close.start()
            errors.append(
                ToolCallError(
                    "unclosed_tag",
                    f"tool call {index} has no closing {CLOSE_TAG}: {_short(text[body_start:end])!r}",
                    index,
                )
            )
            index += 1
            pos = end
            if close is None:
                break
            continue
        result = _parse_block(text[body_start : close.start()], index, by_name)
        if isinstance(result, ToolCall):
            calls.append(result)
        else:
            errors.append(result)
        index += 1
        pos = close.end()
    return ParsedTurn(calls=calls, errors=errors, text="".join(prose).strip())


def format_call(name: str, arguments: Mapping[str, Any]) -> str:
    """The canonical text of one call (for prompts' examples and scripted models)."""
    return f"{OPEN_TAG}{json.dumps({'name': name, 'arguments': dict(arguments)}, ensure_ascii=False)}{CLOSE_TAG}"


def format_response(content: str, *, name: str | None = None, is_error: bool = False) -> str:
    """One observation block.

    A literal ``</tool_response>`` inside ``content`` (a file the agent cat-ed, say) is escaped so
    the block cannot appear to end early. Observations are never parsed for tool calls, so
    ``<tool_call>`` in them needs no escaping (and the format hint of ``format_errors`` shows it).
    """
    safe = content.replace(RESPONSE_CLOSE_TAG, "<\\/tool_response>")
    attrs = (f' name="{html.escape(name, quote=True)}"' if name else "") + (' error="true"' if is_error else "")
    return f"<tool_response{attrs}>\n{safe}\n{RESPONSE_CLOSE_TAG}"


#: how the errors' hint shows a hermes call.
CALL_SHAPE = f'{OPEN_TAG}{{"name": "<tool>", "arguments": {{...}}}}{CLOSE_TAG}'


def errors_text(errors: Sequence[ToolCallError], *, call_shape: str = CALL_SHAPE) -> str:
    """What was wrong with a turn's calls, and the expected format (``call_shape``), as the model reads it.

    Plain text for a ``tool`` message (templates that wrap tool results add the tags themselves).
    """
    lines = [f"- {e.message}" for e in errors]
    return "\n".join(["Your tool call could not be run:", *lines, f"Write each call as {call_shape}."])


def format_errors(errors: Sequence[ToolCallError]) -> str:
    """``errors_text`` as a ``<tool_response>`` block, for prompts that carry observations inline."""
    return format_response(errors_text(errors), is_error=True)
