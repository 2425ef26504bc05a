"""Reasoning split from the answer, one parser per model family's format.

A reasoning model writes its thinking before its answer (``<think>...</think>`` for Qwen3 and
DeepSeek-R1). A ``ReasoningParser`` takes the decoded text as it streams and splits it into
reasoning and answer text; the answer text goes on to the tool-call parser. Each format is
registered in ``farm.proxy.parsers`` under the name vLLM gives it (``--reasoning-parser``).
Today only ``none``: every sampled id is recorded either way, this only decides what the harness
is shown as reasoning.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol


@dataclass(frozen=True)
class Split:
    """A piece of decoded text split into the model's reasoning and its answer."""

    reasoning: str = ""
    content: str = ""


class ReasoningParser(Protocol):
    """Feed the decoded text with ``push`` as it streams; ``finish`` at the end."""

    def push(self, text: str) -> Split: ...

    def finish(self) -> Split: ...


class NoReasoning:
    """The model writes no reasoning of its own: all of its text is the answer."""

    def push(self, text: str) -> Split:
        return Split(content=text)

    def finish(self) -> Split:
        return Split()
