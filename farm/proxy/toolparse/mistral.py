"""The ``mistral`` tool-call format (vLLM's ``mistral`` parser): Mistral, Magistral, Devstral.

Calls follow a ``[TOOL_CALLS]`` token, in one of two dialects (vLLM picks by the tokenizer, the
text tells them apart): before tokenizer v11 a JSON list ``[TOOL_CALLS][{"name": ..., "arguments":
{...}}, ...]``; from v11 one marker per call, ``[TOOL_CALLS]NAME[ARGS]{...}`` (v13 may put
``[CALL_ID]ID`` before ``[ARGS]``). There is no closing tag: a call ends with its JSON. v11
arguments are typed by the tool's schema as in vLLM; the list dialect's are kept as written.
"""

from __future__ import annotations

import json
from typing import Any

from farm.proxy.toolparse import CallPiece, Piece, TextPiece
from farm.proxy.toolparse.scan import SchemaTypes, Tools, dumps, json_end, merge, partial_tail

TOOL_CALLS = "[TOOL_CALLS]"
ARGS = "[ARGS]"
CALL_ID = "[CALL_ID]"


class MistralToolCallParser:
    """``[TOOL_CALLS]`` calls (a ``farm.proxy.toolparse.ToolCallParser``)."""

    def __init__(self, *, tools: Tools | None = None) -> None:
        self._types = SchemaTypes(tools)
        self._pending = ""
        self._in_call = False

    def push(self, text: str) -> list[Piece]:
        self._pending += text
        pieces: list[Piece] = []
        while self._pending:
            if self._in_call:
                result = self._read_call(self._pending[len(TOOL_CALLS) :])
                if result is None:
                    break
                calls, used = result
                block = self._pending[: len(TOOL_CALLS) + used]
                self._pending, self._in_call = self._pending[len(block) :], False
                pieces.extend(calls if calls else [TextPiece(block)])
                continue
            at = self._pending.find(TOOL_CALLS)
            if at >= 0:
                pieces.append(TextPiece(self._pending[:at]))
                self._pending, self._in_call = self._pending[at:], True
                continue
            keep = partial_tail(self._pending, [TOOL_CALLS])
            pieces.append(TextPiece(self._pending[: len(self._pending) - keep]))
            self._pending = self._pending[len(self._pending) - keep :]
            break
        return merge(pieces)

    def finish(self) -> list[Piece]:
        """A call whose JSON never closed is prose."""
        rest, self._pending, self._in_call = self._pending, "", False
        return [TextPiece(rest)] if rest else []

    def _read_call(self, text: str) -> tuple[list[Piece], int] | None:
        """The calls at the start of ``text`` and how much of it they use; None: not complete yet."""
        lead = len(text) - len(text.lstrip())
        if lead == len(text) or TOOL_CALLS.startswith(text[lead:]):
            return None
        if text.startswith(TOOL_CALLS, lead):
            return [], lead  # a marker with no call after it is prose; the next one is read anew
        if text[lead] in "[{":  # the JSON-list dialect
            end = json_end(text, lead)
            if end is None:
                return None
            return _listed(text[lead:end]), end
        # The name runs up to [ARGS] (or [CALL_ID], or straight into the arguments' brace).
        ends = [at for at in (text.find("{"), text.find(ARGS), text.find(CALL_ID), text.find(TOOL_CALLS)) if at >= 0]
        if not ends:
            return None
        name_end = min(ends)
        name = text[:name_end].strip()
        start = text.find("{", name_end)
        if start < 0:
            return None
        between = text[name_end:start]
        if not (between == "" or between.startswith(ARGS) or between.startswith(CALL_ID)):
            return [], name_end
        end = json_end(text, start)
        if end is None:
            return None
        try:
            arguments = json.loads(text[start:end])
        except ValueError:
            return [], end
        if not name or not isinstance(arguments, dict):
            return [], end
        return [CallPiece(name=name, arguments=dumps(self._types.apply(name, arguments)))], end


def _listed(text: str) -> list[Piece]:
    try:
        value: Any = json.loads(text)
    except ValueError:
        return []
    calls: list[Piece] = []
    for entry in value if isinstance(value, list) else [value]:
        if not isinstance(entry, dict) or not isinstance(entry.get("name"), str) or not entry["name"]:
            return []
        arguments = entry.get("arguments", {})
        if isinstance(arguments, str):
            try:
                arguments = json.loads(arguments)
            except ValueError:
                return []
        if not isinstance(arguments, dict):
            return []
        calls.append(CallPiece(name=entry["name"], arguments=dumps(arguments)))
    return calls
