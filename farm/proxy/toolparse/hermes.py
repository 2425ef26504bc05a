"""The ``hermes`` tool-call format (vLLM's ``hermes`` parser): Qwen 2.5/3, Hermes, and the tiny model.

The model writes a call as ``<tool_call>{"name": ..., "arguments": {...}}</tool_call>`` (their
templates render calls the same way, so a reply the harness echoes back renders as the model wrote
it). ``HermesToolCallParser`` takes the decoded text piece by piece and hands back prose as soon as it
cannot be the start of a call block, and each call once its block closes. A block that is not a
well-formed call stays prose.
"""

from __future__ import annotations

import json

from farm.proxy.toolparse import CallPiece, Piece, TextPiece
from farm.proxy.toolparse.scan import Tools

OPEN_TAG = "<tool_call>"
CLOSE_TAG = "</tool_call>"


def parse_call(body: str) -> CallPiece | None:
    """A block's body as a call, or None when it is not ``{"name": str, "arguments": object}``."""
    try:
        value = json.loads(body)
    except ValueError:
        return None
    if not isinstance(value, dict) or not isinstance(value.get("name"), str) or not value["name"]:
        return None
    arguments = value.get("arguments", value.get("parameters", {}))
    if isinstance(arguments, str):  # some models write the arguments as a JSON string
        try:
            arguments = json.loads(arguments)
        except ValueError:
            return None
    if not isinstance(arguments, dict):
        return None
    return CallPiece(name=value["name"], arguments=json.dumps(arguments, ensure_ascii=False))


class HermesToolCallParser:
    """``<tool_call>`` blocks (a ``farm.proxy.toolparse.ToolCallParser``)."""

    def __init__(self, *, tools: Tools | None = None) -> None:
        # Hermes arguments are JSON already: nothing to type by the schema (vLLM's parser neither).
        self._pending = ""
        self._in_block = False

    def push(self, text: str) -> list[Piece]:
        self._pending += text
        pieces: list[Piece] = []
        while self._pending:
            if self._in_block:
                end = self._pending.find(CLOSE_TAG)
                if end < 0:
                    break
                body = self._pending[len(OPEN_TAG) : end]
                block = self._pending[: end + len(CLOSE_TAG)]
                self._pending = self._pending[end + len(CLOSE_TAG) :]
                self._in_block = False
                call = parse_call(body.strip())
                pieces.append(call if call is not None else TextPiece(block))
                continue
            start = self._pending.find(OPEN_TAG)
            if start >= 0:
                if start:
                    pieces.append(TextPiece(self._pending[:start]))
                self._pending = self._pending[start:]
                self._in_block = True
                continue
            # Hold back only a tail that could still grow into the opening tag.
            keep = _partial_tag(self._pending)
            ready = self._pending[: len(self._pending) - keep]
            if ready:
                pieces.append(TextPiece(ready))
            self._pending = self._pending[len(ready) :]
            break
        return _merge(pieces)

    def finish(self) -> list[Piece]:
        """What is left: an unclosed block or a partial tag is prose."""
        rest, self._pending, self._in_block = self._pending, "", False
        return [TextPiece(rest)] if rest else []


def _partial_tag(text: str) -> int:
    for size in range(min(len(OPEN_TAG) - 1, len(text)), 0, -1):
        if OPEN_TAG.startswith(text[-size:]):
            return size
    return 0


def _merge(pieces: list[Piece]) -> list[Piece]:
    out: list[Piece] = []
    for piece in pieces:
        if isinstance(piece, TextPiece) and out and isinstance(out[-1], TextPiece):
            out[-1] = TextPiece(out[-1].text + piece.text)
        elif not (isinstance(piece, TextPiece) and not piece.text):
            out.append(piece)
    return out
