"""The ``kimi_k2`` tool-call format (vLLM's ``kimi_k2`` parser): Kimi K2.

Calls sit in one section: ``<|tool_calls_section_begin|><|tool_call_begin|>functions.NAME:0
<|tool_call_argument_begin|>{ARGS}<|tool_call_end|>...<|tool_calls_section_end|>``. The header is
Kimi's call id (``functions.NAME:INDEX``); the name is its part before the colon. Arguments are
JSON, typed by the tool's schema as in vLLM.
"""

from __future__ import annotations

import json
import re

from farm.proxy.toolparse import Piece
from farm.proxy.toolparse.scan import TaggedBlocks, unfinished

SECTION_OPEN = "<|tool_calls_section_begin|>"
SECTION_CLOSE = "<|tool_calls_section_end|>"
_CALL = re.compile(r"<\|tool_call_begin\|>(.*?)<\|tool_call_argument_begin\|>(.*?)<\|tool_call_end\|>", re.DOTALL)
_HEADER = re.compile(r"(.+):\d+")


class KimiK2ToolCallParser(TaggedBlocks):
    """Kimi K2's call section (a ``farm.proxy.toolparse.ToolCallParser``)."""

    blocks = {SECTION_OPEN: SECTION_CLOSE}

    def _parse(self, tag: str, body: str, closed: bool) -> list[Piece] | None:
        calls: list[Piece] = []
        end = 0
        for call in _CALL.finditer(body):
            header, args = call.groups()
            end = call.end()
            match = _HEADER.match(header.strip())
            try:
                arguments = json.loads(args) if args.strip() else {}
            except ValueError:
                return None
            if match is None or not isinstance(arguments, dict):
                return None
            name = match.group(1).split(":")[0].removeprefix("functions.")
            if not name:
                return None
            calls.append(self._call(name, arguments))
        return unfinished(calls, body, closed, end)
