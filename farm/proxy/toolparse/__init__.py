"""Tool calls out of the model's text, one parser per model family's format.

Each format is a ``ToolCallParser`` in a module of its own, registered in ``PARSERS`` under the
name vLLM gives it (``--tool-call-parser``), so a family's parser is chosen by name
(``farm.proxy.parsers.choose``). Today: ``hermes``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol


@dataclass(frozen=True)
class TextPiece:
    """Prose the harness sees as the answer's text."""

    text: str


@dataclass(frozen=True)
class CallPiece:
    """A complete tool call."""

    name: str
    #: the arguments object as compact JSON text.
    arguments: str


Piece = TextPiece | CallPiece


class ToolCallParser(Protocol):
    """Feed the decoded text with ``push`` as it streams; ``finish`` at the end. Pieces come out in
    order: prose as soon as it cannot be part of a call, each call once it is complete. A call that
    is not well formed stays prose: the policy is not credited with a call it did not make."""

    def push(self, text: str) -> list[Piece]: ...

    def finish(self) -> list[Piece]: ...


class NoToolCalls:
    """No tool calls are parsed (the request offers no tools, or ``tool_choice`` is none)."""

    def push(self, text: str) -> list[Piece]:
        return [TextPiece(text)] if text else []

    def finish(self) -> list[Piece]:
        return []
