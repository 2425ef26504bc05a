"""The ``glm45`` tool-call format (vLLM's ``glm45``/``glm47`` parser): GLM-4.5, 4.6 and 4.7.

A call is ``<tool_call>NAME<arg_key>KEY</arg_key><arg_value>VALUE</arg_value>...</tool_call>``
(GLM-4.5/4.6 put newlines between the parts). Values are text, typed by the tool's schema as in
vLLM; a call naming a tool the request does not offer is not a call (vLLM checks the names too).
"""

from __future__ import annotations

import re

from farm.proxy.toolparse import Piece
from farm.proxy.toolparse.scan import TaggedBlocks

_ARG = re.compile(r"<arg_key>(.*?)</arg_key>\s*<arg_value>(.*?)</arg_value>", re.DOTALL)


class Glm45ToolCallParser(TaggedBlocks):
    """``<tool_call>NAME<arg_key>...`` blocks (a ``farm.proxy.toolparse.ToolCallParser``)."""

    blocks = {"<tool_call>": "</tool_call>"}

    def _parse(self, tag: str, body: str, closed: bool) -> list[Piece] | None:
        if not closed:
            return None
        name, _, args = body.partition("<arg_key>")
        name = name.strip()
        if not name or "<" in name or not self._types.known(name):
            return None
        arguments = {key.strip(): value for key, value in _ARG.findall("<arg_key>" + args if args else "")}
        return [self._call(name, arguments)]
