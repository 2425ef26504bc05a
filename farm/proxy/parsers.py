"""The one place a call's tool-call and reasoning parsers are chosen, by the names vLLM uses.

``choose`` picks the names for a trial (today every trial's model writes ``hermes`` calls and no
reasoning of its own; a model family's template, a backend or a trial may name others). The
registries map a name to its parser: a family's format is added here and in a module of its own
(``farm.proxy.toolparse.<name>``, ``farm.proxy.reasoning``), and the core never branches on which.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TypeVar

from farm.errors import ConfigError
from farm.proxy.events import TrialContext
from farm.proxy.reasoning import NoReasoning, ReasoningParser
from farm.proxy.reasoning_formats import (
    DeepSeekR1ReasoningParser,
    Glm45ReasoningParser,
    HarmonyReasoningParser,
    KimiK2ReasoningParser,
    Qwen3ReasoningParser,
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
P = TypeVar("P")


@dataclass(frozen=True)
class ParserNames:
    """Which parsers read a trial's answers."""

    tool_calls: str = "hermes"
    reasoning: str = "none"


def choose(trial: TrialContext) -> ParserNames:
    """The parsers for the trial's model (every model served today writes hermes calls)."""
    return ParserNames()


def tool_call_parser(name: str, *, parse_calls: bool, tools: Tools | None = None) -> ToolCallParser:
    """A fresh parser for one answer; ``parse_calls`` False: all text is prose (no tools offered).
    ``tools``: the request's tools, in the OpenAI function shape.

    Raises:
        ConfigError: no parser has this name (the message lists the known ones).
    """
    if not parse_calls:
        return NoToolCalls()
    return _make(TOOL_CALL_PARSERS, name, "tool-call")(tools=tools)


def reasoning_parser(name: str) -> ReasoningParser:
    """A fresh parser for one answer.

    Raises:
        ConfigError: no parser has this name (the message lists the known ones).
    """
    return _make(REASONING_PARSERS, name, "reasoning")()


def _make(registry: dict[str, Callable[..., P]], name: str, kind: str) -> Callable[..., P]:
    try:
        return registry[name]
    except KeyError:
        raise ConfigError(f"no {kind} parser {name!r}; known: {', '.join(sorted(registry))}") from None
