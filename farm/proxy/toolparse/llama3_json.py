"""The ``llama3_json`` tool-call format (vLLM's ``llama3_json`` parser): Llama 3.1, 3.2, 3.3 and 4.

A call is a bare JSON object, ``{"name": NAME, "parameters": {...}}`` (``arguments`` also read),
optionally after ``<|python_tag|>``; parallel calls are separated by ``;``. Any such object in the
text is a call, as in vLLM; an object that is not a call, or braces that are not JSON, stay prose.
Arguments are kept as written.
"""

from __future__ import annotations

import json

from farm.proxy.toolparse import CallPiece, Piece, TextPiece
from farm.proxy.toolparse.scan import Tools, dumps, json_end, merge, partial_tail

PYTHON_TAG = "<|python_tag|>"
_SEPARATORS = " \t\r\n;"


class Llama3JsonToolCallParser:
    """Bare JSON calls (a ``farm.proxy.toolparse.ToolCallParser``)."""

    def __init__(self, *, tools: Tools | None = None) -> None:
        self._pending = ""
        self._after_call = False  # separators after a call are dropped when another call follows

    def push(self, text: str) -> list[Piece]:
        self._pending += text
        pieces: list[Piece] = []
        while self._pending:
            if self._after_call:
                rest = self._pending.lstrip(_SEPARATORS)
                if not rest:
                    break
                if rest.startswith("{") or rest.startswith(PYTHON_TAG):
                    self._pending = rest
                self._after_call = False
            at = _start(self._pending)
            if at < 0:
                keep = partial_tail(self._pending, [PYTHON_TAG])
                pieces.append(TextPiece(self._pending[: len(self._pending) - keep]))
                self._pending = self._pending[len(self._pending) - keep :]
                break
            if self._pending.startswith(PYTHON_TAG, at):
                pieces.append(TextPiece(self._pending[:at]))
                self._pending = self._pending[at + len(PYTHON_TAG) :]
                continue
            pieces.append(TextPiece(self._pending[:at]))
            self._pending = self._pending[at:]
            if not _may_be_object(self._pending):
                pieces.append(TextPiece("{"))
                self._pending = self._pending[1:]
                continue
            end = json_end(self._pending, 0)
            if end is None:
                break
            call = _call(self._pending[:end])
            pieces.append(call if call is not None else TextPiece(self._pending[:end]))
            self._pending = self._pending[end:]
            self._after_call = call is not None
        return merge(pieces)

    def finish(self) -> list[Piece]:
        """An object that never closed is prose."""
        rest, self._pending, self._after_call = self._pending, "", False
        return [TextPiece(rest)] if rest else []


def _start(text: str) -> int:
    brace, tag = text.find("{"), text.find(PYTHON_TAG)
    return min(at for at in (brace, tag) if at >= 0) if brace >= 0 or tag >= 0 else -1


def _may_be_object(text: str) -> bool:
    """Whether ``text`` (opening with ``{``) can still be a JSON object: its first key comes next."""
    rest = text[1:].lstrip(" \t\r\n")
    return not rest or rest[0] in '"}'


def _call(text: str) -> CallPiece | None:
    try:
        value = json.loads(text)
    except ValueError:
        return None
    if not isinstance(value, dict) or not isinstance(value.get("name"), str):
        return None
    if "arguments" not in value and "parameters" not in value:
        return None
    arguments = value["arguments"] if "arguments" in value else value["parameters"]
    if not isinstance(arguments, dict):
        return None
    return CallPiece(name=value["name"], arguments=dumps(arguments))
