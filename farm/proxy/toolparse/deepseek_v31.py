"""The ``deepseek_v31`` tool-call format (vLLM's ``deepseek_v31`` parser): DeepSeek V3.1.

Calls sit in one section: ``<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>NAME<｜tool▁sep｜>{ARGS}
<｜tool▁call▁end｜>...<｜tool▁calls▁end｜>`` (the markers are single tokens written with fullwidth
bars and U+2581). The arguments are the JSON object as written; they are not typed by schema.
"""

from __future__ import annotations

import json
import re

from farm.proxy.toolparse import Piece
from farm.proxy.toolparse.scan import TaggedBlocks, unfinished

SECTION_OPEN = "<｜tool▁calls▁begin｜>"
SECTION_CLOSE = "<｜tool▁calls▁end｜>"
_CALL = re.compile(r"<｜tool▁call▁begin｜>(.*?)<｜tool▁sep｜>(.*?)<｜tool▁call▁end｜>", re.DOTALL)


class DeepSeekV31ToolCallParser(TaggedBlocks):
    """DeepSeek V3.1's call section (a ``farm.proxy.toolparse.ToolCallParser``)."""

    blocks = {SECTION_OPEN: SECTION_CLOSE}

    def _parse(self, tag: str, body: str, closed: bool) -> list[Piece] | None:
        calls: list[Piece] = []
        end = 0
        for match in _CALL.finditer(body):
            name, args = match.groups()
            end = match.end()
            try:
                arguments = json.loads(args)
            except ValueError:
                return None
            if not name or not isinstance(arguments, dict):
                return None
            calls.append(self._call(name, arguments, typed=False))
        return unfinished(calls, body, closed, end)
