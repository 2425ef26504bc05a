"""The one place a call's tool-call and reasoning parsers are chosen, by the names vLLM uses.

``choose`` picks the names for the model a proxy serves (one model per proxy, so every trial's):
``proxy.tool_parser`` and ``proxy.reasoning_parser`` when set, else what the model's family says
(``farm.llm.families``: ``proxy.family``, or the family whose published chat template the tokenizer
carries), else ``hermes`` calls and no reasoning. The registries map a name to its parser: a
family's format is added here and in a module of its own (``farm.proxy.toolparse.<name>``,
``farm.proxy.reasoning_formats``), and the core never branches on which.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, TypeVar

from farm.config import ProxySettings
from farm.errors import ConfigError
from farm.llm.families import FAMILIES
from farm.proxy.reasoning import NoReasoning, ReasoningParser
from farm.proxy.reasoning_formats import (
    DeepSeekR1ReasoningParser,
    Glm45ReasoningParser,
    HarmonyReasoningParser,
    KimiK2ReasoningParser,
    Qwen3ReasoningParser,
    ThinkTags,
    prompt_ends_reasoning,
)
from farm.proxy.toolparse import NoToolCalls, ToolCallParser
from farm.proxy.toolparse.deepseek_v31 import DeepSeekV31ToolCallParser
from farm.proxy.toolparse.glm45 import Glm45ToolCallParser
from farm.proxy.toolparse.harmony import HarmonyToolCallParser
from farm.proxy.toolparse.hermes import HermesToolCallParser
from farm.proxy.toolparse.kimi_k2 import KimiK2ToolCallParser
from farm.proxy.toolparse.llama3_json import Llama3JsonToolCallParser
from farm.proxy.toolparse.mistral import MistralToolCallParser
from farm.proxy.toolparse.qwen3_coder import Qwen3CoderToolCallParser
from farm.proxy.toolparse.scan import Tools

#: tool-call parsers by vLLM's ``--tool-call-parser`` name; each is made with the request's tools
#: (``tools=``: the formats vLLM types by the tool's schema read the parameters' types from them).
TOOL_CALL_PARSERS: dict[str, Callable[..., ToolCallParser]] = {
    "hermes": HermesToolCallParser,
    "qwen3_coder": Qwen3CoderToolCallParser,
    "llama3_json": Llama3JsonToolCallParser,
    "deepseek_v31": DeepSeekV31ToolCallParser,
    "glm45": Glm45ToolCallParser,
    "kimi_k2": KimiK2ToolCallParser,
    "mistral": MistralToolCallParser,
    "openai": HarmonyToolCallParser,
}
#: reasoning parsers by vLLM's ``--reasoning-parser`` name (``none``: the model writes no reasoning).
REASONING_PARSERS: dict[str, Callable[[], ReasoningParser]] = {
    "none": NoReasoning,
    "deepseek_r1": DeepSeekR1ReasoningParser,
    "qwen3": Qwen3ReasoningParser,
    "openai_gptoss": HarmonyReasoningParser,
    "glm45": Glm45ReasoningParser,
    "kimi_k2": KimiK2ReasoningParser,
}
#: the families' published chat templates (``farm.llm.families``), by ``template_key``; checked
#: against the families cache by tests/unit/proxy/test_proxy_parser_choice.py.
TEMPLATE_FAMILIES: dict[str, str] = {
    "55b2f4a26ac9ee71": "qwen2.5",
    "87a2728cb8dc9fe4": "qwen3",
    "eae48a3307931acb": "qwen3-coder",
    "93c0e9aa3629bbd7": "llama3",
    "bbe594884b44d740": "deepseek-r1",
    "a4aee8afcf2e0711": "qwen3.5",
    "78d976a442bcde2f": "phi-3",
}
P = TypeVar("P")


@dataclass(frozen=True)
class ParserNames:
    """Which parsers read a trial's answers, and the chat-template kwargs the family's default is
    (``Family.template_kwargs``: the built-in agent loop renders with them; a proxy call has its
    harness's own switch, ``farm.proxy.template_kwargs``)."""

    tool_calls: str = "hermes"
    reasoning: str = "none"
    template_kwargs: dict[str, Any] = field(default_factory=dict, hash=False, compare=True)


def template_key(chat_template: str) -> str:
    """A chat template's key in ``TEMPLATE_FAMILIES`` (surrounding whitespace ignored)."""
    return hashlib.sha256(chat_template.strip().encode()).hexdigest()[:16]


def family_of(settings: ProxySettings, chat_template: str | None) -> str | None:
    """The served model's family: ``settings.family``, else the one whose template it carries.

    Raises:
        ConfigError: ``settings.family`` names no family (the message lists them).
    """
    if settings.family is not None:
        if settings.family not in FAMILIES:
            raise ConfigError(f"proxy.family {settings.family!r} is not a family; known: {', '.join(FAMILIES)}")
        return settings.family
    if not isinstance(chat_template, str):  # none, or a dict of named templates
        return None
    return TEMPLATE_FAMILIES.get(template_key(chat_template))


def choose(settings: ProxySettings, chat_template: str | None) -> ParserNames:
    """The parsers that read the served model's answers (see the module docstring).

    Raises:
        ConfigError: a family or parser the settings name does not exist.
    """
    name = family_of(settings, chat_template)
    family = FAMILIES[name] if name is not None else None
    names = ParserNames(
        tool_calls=settings.tool_parser or (family and family.tool_call_parser) or "hermes",
        reasoning=settings.reasoning_parser or (family and family.reasoning_parser) or "none",
        template_kwargs=dict(family.template_kwargs) if family is not None else {},
    )
    _make(TOOL_CALL_PARSERS, names.tool_calls, "tool-call")
    _make(REASONING_PARSERS, names.reasoning, "reasoning")
    return names


def tool_call_parser(name: str, *, parse_calls: bool, tools: Tools | None = None) -> ToolCallParser:
    """A fresh parser for one answer; ``parse_calls`` False: all text is prose (no tools offered).
    ``tools``: the request's tools, in the OpenAI function shape.

    Raises:
        ConfigError: no parser has this name (the message lists the known ones).
    """
    if not parse_calls:
        return NoToolCalls()
    return _make(TOOL_CALL_PARSERS, name, "tool-call")(tools=tools)


def reasoning_parser(name: str, *, prompt_tail: str = "") -> ReasoningParser:
    """A fresh parser for one answer. ``prompt_tail``: the prompt's last text; a prompt that already
    closed the reasoning (``prompt_ends_reasoning``: Qwen3's ``enable_thinking: false``) makes the whole
    answer content, as vLLM's serving layer does (``prompt_is_reasoning_end``).

    Raises:
        ConfigError: no parser has this name (the message lists the known ones).
    """
    make = _make(REASONING_PARSERS, name, "reasoning")
    if isinstance(make, type) and issubclass(make, ThinkTags) and prompt_ends_reasoning(prompt_tail):
        return make(thinking=False)
    return make()


def _make(registry: dict[str, Callable[..., P]], name: str, kind: str) -> Callable[..., P]:
    try:
        return registry[name]
    except KeyError:
        raise ConfigError(f"no {kind} parser {name!r}; known: {', '.join(sorted(registry))}") from None
