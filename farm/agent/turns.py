"""A model turn read as its family writes it: reasoning, answer text and tool calls, by the proxy's parsers.

The built-in loop reads each turn with the parsers the proxy uses for the served model
(``farm.proxy.parsers.choose``: the ``proxy.*`` settings, else the family whose chat template the
tokenizer carries, else ``hermes`` calls and no reasoning): the family's reasoning parser splits the
reasoning from the answer, its tool-call parser reads the calls out of the answer. The turn becomes
the assistant message the family's template wants (``reasoning_content``, ``content``, OpenAI-shaped
``tool_calls``), and the calls to run.

What goes back to the model when a call cannot be run is the loop's (``farm.agent.toolcalls``): a
call naming an unknown tool, or whose arguments do not fit the tool's spec, is answered with what is
wrong. A block the family's parser leaves as prose is no call: in ``hermes`` the loop still says what
is wrong with it (bad JSON, an unclosed tag, ...); in another format the turn has no call, and the
model is reminded of the format (``no_call_hint``).
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from farm.agent.toolcalls import (
    CALL_SHAPE,
    CLOSE_TAG,
    MAX_CALLS_PER_TURN,
    OPEN_TAG,
    ToolCall,
    ToolCallError,
    check_call,
    errors_text,
    parse_tool_calls,
)
from farm.proxy.parsers import ParserNames, reasoning_parser, tool_call_parser
from farm.proxy.toolparse import CallPiece

#: the tool that ends an episode (``farm.agent.loop.SUBMIT``).
SUBMIT = "submit"
#: each tool-call format's call, as the hint and a system prompt show it (by vLLM's parser name).
CALL_SHAPES: dict[str, str] = {
    "hermes": '<tool_call>{"name": ..., "arguments": {...}}</tool_call>',
    "qwen3_coder": "<tool_call>\n<function=NAME>\n<parameter=ARGUMENT>\nVALUE\n</parameter>\n</function>\n</tool_call>",
    "llama3_json": '{"name": ..., "parameters": {...}}',
    "deepseek_v31": (
        "<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>NAME<｜tool▁sep｜>{...}<｜tool▁call▁end｜><｜tool▁calls▁end｜>"
    ),
    "glm45": "<tool_call>NAME\n<arg_key>ARGUMENT</arg_key>\n<arg_value>VALUE</arg_value>\n</tool_call>",
    "kimi_k2": (
        "<|tool_calls_section_begin|><|tool_call_begin|>functions.NAME:0<|tool_call_argument_begin|>{...}"
        "<|tool_call_end|><|tool_calls_section_end|>"
    ),
    "mistral": '[TOOL_CALLS][{"name": ..., "arguments": {...}}]',
    "openai": "<|start|>assistant<|channel|>commentary to=functions.NAME <|constrain|>json<|message|>{...}<|call|>",
}


def no_call_hint(tool_parser: str = "hermes") -> str:
    """What the agent is told when a turn has neither a tool call nor an answer the task accepts."""
    shape = CALL_SHAPES.get(tool_parser, tool_parser)
    return f"No tool call found. Call a tool as {shape}, or call {SUBMIT} when you are done."


@dataclass(frozen=True)
class ReadTurn:
    """One model turn, read."""

    #: the assistant message as the family's template wants it.
    message: dict[str, Any]
    #: well-formed calls to known tools with fitting arguments, in the order written.
    calls: list[ToolCall] = field(default_factory=list)
    #: calls that cannot be run, each with what to tell the model.
    errors: list[ToolCallError] = field(default_factory=list)


class TurnReader:
    """Reads the turns of one episode (call ids count up over the episode)."""

    def __init__(self, parsers: ParserNames | None = None, specs: Sequence[Mapping[str, Any]] = ()) -> None:
        self.parsers = parsers or ParserNames()
        self.specs = [dict(spec) for spec in specs]
        self._by_name = {str(spec.get("name")): spec for spec in self.specs}
        self._calls = 0

    @property
    def no_call_hint(self) -> str:
        return no_call_hint(self.parsers.tool_calls)

    def errors_text(self, errors: Sequence[ToolCallError]) -> str:
        """The observation for calls that cannot be run, with the family's call format."""
        hermes = self.parsers.tool_calls == "hermes"
        return errors_text(errors, call_shape=CALL_SHAPE if hermes else self._shape())

    def _shape(self) -> str:
        return CALL_SHAPES.get(self.parsers.tool_calls, self.parsers.tool_calls)

    def read(self, text: str, *, prompt_tail: str = "") -> ReadTurn:
        """The turn's message, calls and errors (calls are read only where the episode has tools).
        ``prompt_tail``: the prompt's last text; one that closed the think block makes the whole
        reply content, as the proxy reads it (``farm.proxy.parsers.reasoning_parser``)."""
        reasoning = reasoning_parser(self.parsers.reasoning, prompt_tail=prompt_tail)
        first, last = reasoning.push(text), reasoning.finish()
        thought, answer = first.reasoning + last.reasoning, first.content + last.content
        tools = tool_call_parser(self.parsers.tool_calls, parse_calls=bool(self.specs), tools=self.specs)
        pieces = [*tools.push(answer), *tools.finish()]
        prose: list[str] = []
        written: list[dict[str, Any]] = []
        calls: list[ToolCall] = []
        errors: list[ToolCallError] = []
        index = 0
        for piece in pieces:
            if not isinstance(piece, CallPiece):
                prose.append(piece.text)
                if (
                    self.parsers.tool_calls == "hermes"
                    and self.specs
                    and (OPEN_TAG in piece.text or CLOSE_TAG in piece.text)
                ):
                    index += self._diagnose(piece.text, index, errors)
                continue
            if len(calls) + len(errors) >= MAX_CALLS_PER_TURN:
                errors.append(
                    ToolCallError("too_many_calls", f"at most {MAX_CALLS_PER_TURN} tool calls per turn", index)
                )
                break
            self._calls += 1
            call_id = f"call{self._calls:05d}"  # nine characters: what Mistral's template demands
            arguments = _arguments(piece.arguments)
            written.append(
                {"id": call_id, "type": "function", "function": {"name": piece.name, "arguments": arguments}}
            )
            checked = check_call(piece.name, arguments, index, self._by_name, call_id=call_id)
            if isinstance(checked, ToolCall):
                calls.append(checked)
            else:
                errors.append(checked)
            index += 1
        message: dict[str, Any] = {"role": "assistant", "content": "".join(prose)}
        if thought:
            message["reasoning_content"] = thought
        if written:
            message["tool_calls"] = written
        return ReadTurn(message=message, calls=calls, errors=errors)

    def _diagnose(self, prose: str, index: int, errors: list[ToolCallError]) -> int:
        """What is wrong with the hermes blocks the parser left as prose; returns how many there were."""
        found = parse_tool_calls(prose, self.specs, first_index=index)
        errors += found.errors
        for call in found.calls:  # read by the loop's lenient reader (a Markdown fence...), not by the format's
            errors.append(
                ToolCallError(
                    "bad_shape",
                    f"tool call {call.index} ({call.name}) is not written as the format wants: {CALL_SHAPE}",
                    call.index,
                    call.name,
                )
            )
        return len(found.calls) + len(found.errors)


def _arguments(text: str) -> dict[str, Any]:
    try:
        value = json.loads(text)
    except ValueError:
        return {}
    return value if isinstance(value, dict) else {}
