"""The ``qwen3_coder`` tool-call format (vLLM's ``qwen3_coder`` parser): Qwen3-Coder, Qwen3.5.

A call is ``<tool_call>\\n<function=NAME>\\n<parameter=KEY>\\nVALUE\\n</parameter>\\n...</function>\\n</tool_call>``
(the template's newlines around a value are markup, one each side is dropped). Values are text;
they are typed by the tool's schema as vLLM does (``days`` declared an integer: ``3``, not ``"3"``),
and stay strings where the request gives no schema. A ``<function=...>`` block written without
the ``<tool_call>`` wrapper is a call too, as in vLLM.
"""

from __future__ import annotations

import re

from farm.proxy.toolparse import Piece
from farm.proxy.toolparse.scan import TaggedBlocks, unfinished

_FUNCTION = re.compile(r"<function=([^>]*)>(.*?)</function>", re.DOTALL)
# A parameter ends at its closing tag or where the next one opens (models drop the closing tag).
_PARAMETER = re.compile(r"<\s*parameter\s*=\s*([^>]*)>(.*?)(?:<\s*/\s*parameter\s*>|(?=<\s*parameter\s*=))", re.DOTALL)


class Qwen3CoderToolCallParser(TaggedBlocks):
    """``<tool_call><function=...>`` blocks (a ``farm.proxy.toolparse.ToolCallParser``)."""

    blocks = {"<tool_call>": "</tool_call>", "<function=": "</function>"}

    def _parse(self, tag: str, body: str, closed: bool) -> list[Piece] | None:
        if tag == "<function=":
            body = f"<function={body}</function>" if closed else ""
        calls: list[Piece] = []
        end = 0
        for match in _FUNCTION.finditer(body):
            name = match.group(1).strip()
            if not name:
                return None
            arguments = {key: _unwrap(value) for key, value in _PARAMETER.findall(match.group(2))}
            calls.append(self._call(name, arguments))
            end = match.end()
        return unfinished(calls, body, closed, end)


def _unwrap(value: str) -> str:
    value = value.removeprefix("\n")
    return value.removesuffix("\n")
