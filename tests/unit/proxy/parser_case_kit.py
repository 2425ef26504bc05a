"""What the tables of model outputs (``parser_cases``, ``parser_edge_cases``, ``reasoning_cases``) are made of.

The cases are shared by the unit tests and the vLLM agreement test.

Each tool case is the text a model of that family writes, the request's tools (None: no schema),
and what the farm reads from it: the calls (name, arguments as parsed JSON) and the prose. Where
vLLM's parser reads a case differently on purpose, ``vllm`` says what vLLM finds and why the farm
does not follow (the agreement test checks that the difference is exactly that).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

#: a call as (name, arguments); vLLM may pass on arguments that are not an object (documented cases).
Call = tuple[str, Any]


@dataclass(frozen=True)
class ToolCase:
    parser: str
    name: str
    text: str
    calls: list[Call]
    prose: str
    tools: list[dict[str, Any]] | None = None
    #: vLLM's parser picks Mistral's dialect by the vocabulary: True runs it with ``[ARGS]`` in it.
    mistral_v11: bool = False
    #: (vLLM's calls, why the farm differs) where the farm deliberately reads the text otherwise.
    vllm: tuple[list[Call], str] | None = None


@dataclass(frozen=True)
class ReasoningCase:
    parser: str
    name: str
    text: str
    reasoning: str
    content: str
    #: False: the request turned thinking off (``chat_template_kwargs``).
    thinking: bool = True
    #: (vLLM's reasoning, vLLM's content, why the farm differs).
    vllm: tuple[str, str, str] | None = field(default=None)


def weather_tools() -> list[dict[str, Any]]:
    props = {
        "city": {"type": "string"},
        "days": {"type": "integer"},
        "metric": {"type": "boolean"},
        "filter": {"type": "object"},
        "hours": {"type": "array", "items": {"type": "integer"}},
        "ratio": {"type": ["number", "null"]},
    }
    return [
        {
            "type": "function",
            "function": {"name": "get_weather", "parameters": {"type": "object", "properties": props}},
        },
        {"type": "function", "function": {"name": "list_files", "parameters": {"type": "object", "properties": {}}}},
    ]


TOOLS = weather_tools()
NESTED = {"a": [1, {"b": None, "c": "x}y"}], "d": {"e": True}}
UNICODE_CITY = "東京 🌸 «Ça»"


def qc(name: str, **params: str) -> str:
    body = "".join(f"<parameter={k}>\n{v}\n</parameter>\n" for k, v in params.items())
    return f"<tool_call>\n<function={name}>\n{body}</function>\n</tool_call>"


LLAMA_CALL = '{"name": "get_weather", "parameters": {"city": "Tokyo", "days": 3}}'


def ds(name: str, args: str) -> str:
    return f"<｜tool▁call▁begin｜>{name}<｜tool▁sep｜>{args}<｜tool▁call▁end｜>"


def glm(name: str, sep: str = "\n", **args: str) -> str:
    body = "".join(f"<arg_key>{k}</arg_key>{sep}<arg_value>{v}</arg_value>{sep}" for k, v in args.items())
    return f"<tool_call>{name}{sep}{body}</tool_call>"


def kimi(header: str, args: str) -> str:
    return f"<|tool_call_begin|>{header}<|tool_call_argument_begin|>{args}<|tool_call_end|>"


ANALYSIS = "<|channel|>analysis<|message|>Need the weather.<|end|><|start|>assistant"
HARMONY_CALL = '<|channel|>commentary to=functions.get_weather <|constrain|>json<|message|>{"city": "Tokyo"}<|call|>'

DS_OPEN, DS_CLOSE = "<｜tool▁calls▁begin｜>", "<｜tool▁calls▁end｜>"
KS_OPEN, KS_CLOSE = "<|tool_calls_section_begin|>", "<|tool_calls_section_end|>"
HERMES_CALL = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Tokyo"}}\n</tool_call>'
