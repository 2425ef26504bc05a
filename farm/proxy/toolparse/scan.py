"""What the format modules share: a streaming reader of tagged blocks, JSON extents, schema typing.

``TaggedBlocks`` is the streaming half of most formats: prose until one of the format's opening
tags, then a block up to its closing tag, which the format turns into calls (or leaves as prose).
``json_end`` finds where a JSON value written by the model ends (formats with no closing tag).
``SchemaTypes`` types a call's argument values by the request's tool schemas, as vLLM's parsers do
for the formats whose values are written as text (``<parameter=days>3</parameter>``).
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping, Sequence
from typing import Any

from farm.proxy.toolparse import CallPiece, Piece, TextPiece

#: the request's tools as the wire format has them (``{"type": "function", "function": {...}}``).
Tools = Sequence[Mapping[str, Any]]


def merge(pieces: list[Piece]) -> list[Piece]:
    """Adjacent prose joined, empty prose dropped."""
    out: list[Piece] = []
    for piece in pieces:
        if isinstance(piece, TextPiece):
            if not piece.text:
                continue
            if out and isinstance(out[-1], TextPiece):
                out[-1] = TextPiece(out[-1].text + piece.text)
                continue
        out.append(piece)
    return out


def partial_tail(text: str, tags: Sequence[str]) -> int:
    """The length of the longest tail of ``text`` that could still grow into one of ``tags``."""
    best = 0
    for tag in tags:
        for size in range(min(len(tag) - 1, len(text)), best, -1):
            if tag.startswith(text[-size:]):
                best = size
                break
    return best


def first_of(text: str, tags: Sequence[str]) -> tuple[int, str]:
    """Where the earliest of ``tags`` starts in ``text`` and which: ``(-1, "")`` when none does."""
    best, which = -1, ""
    for tag in tags:
        at = text.find(tag)
        if at >= 0 and (best < 0 or at < best):
            best, which = at, tag
    return best, which


def json_end(text: str, start: int) -> int | None:
    """The end of the JSON object or array opening at ``text[start]``; None while it is still open.

    Brackets are counted outside strings only; whether the span parses is the caller's question.
    """
    depth = 0
    in_string = escaped = False
    for i in range(start, len(text)):
        c = text[i]
        if in_string:
            if escaped:
                escaped = False
            elif c == "\\":
                escaped = True
            elif c == '"':
                in_string = False
        elif c == '"':
            in_string = True
        elif c in "{[":
            depth += 1
        elif c in "}]":
            depth -= 1
            if depth == 0:
                return i + 1
    return None


def dumps(value: object) -> str:
    """Arguments as the farm hands them on: compact, unicode kept."""
    return json.dumps(value, ensure_ascii=False)


def unfinished(calls: list[Piece], body: str, closed: bool, end: int) -> list[Piece] | None:
    """A block's calls; in a block the answer left open, what follows the last whole call is prose."""
    if not calls:
        return None
    tail = body[end:]
    return calls if closed or not tail.strip() else [*calls, TextPiece(tail)]


class TaggedBlocks:
    """Prose with call blocks between an opening and a closing tag (a ``ToolCallParser``).

    A subclass names its opening tags and their closing tags and turns a block's body into pieces
    (``_parse``; None: the block is not a well-formed call and stays prose, tags included).
    """

    #: opening tag -> closing tag.
    blocks: Mapping[str, str] = {}

    def __init__(self, *, tools: Tools | None = None) -> None:
        self._types = SchemaTypes(tools)
        self._pending = ""
        self._open = ""  # the opening tag of the block being read, "" in prose

    def _parse(self, tag: str, body: str, closed: bool) -> list[Piece] | None:
        raise NotImplementedError

    def push(self, text: str) -> list[Piece]:
        self._pending += text
        pieces: list[Piece] = []
        while self._pending:
            if self._open:
                close = self.blocks[self._open]
                end = self._pending.find(close, len(self._open))
                if end < 0:
                    break
                block = self._pending[: end + len(close)]
                self._pending = self._pending[len(block) :]
                pieces.extend(self._block(block, len(close), closed=True))
                continue
            at, tag = first_of(self._pending, list(self.blocks))
            if at >= 0:
                pieces.append(TextPiece(self._pending[:at]))
                self._pending, self._open = self._pending[at:], tag
                continue
            keep = partial_tail(self._pending, list(self.blocks))
            pieces.append(TextPiece(self._pending[: len(self._pending) - keep]))
            self._pending = self._pending[len(self._pending) - keep :]
            break
        return merge(pieces)

    def finish(self) -> list[Piece]:
        """An unclosed block gives the calls it completed (as vLLM does); the rest is prose."""
        rest, self._pending = self._pending, ""
        if self._open and rest:
            return merge(self._block(rest, 0, closed=False))
        return [TextPiece(rest)] if rest else []

    def _block(self, block: str, close_size: int, *, closed: bool) -> list[Piece]:
        tag, self._open = self._open, ""
        parsed = self._parse(tag, block[len(tag) : len(block) - close_size], closed)
        return parsed if parsed is not None else [TextPiece(block)]

    def _call(self, name: str, arguments: dict[str, Any], *, typed: bool = True) -> CallPiece:
        return CallPiece(name=name, arguments=dumps(self._types.apply(name, arguments) if typed else arguments))


class SchemaTypes:
    """Argument values typed by the tool's JSON schema, as vLLM's parser engine does.

    A value written as text (``"3"``) becomes what the property's schema allows first, in the order
    null, integer, number, boolean, object, array, string; a value of another type is judged by
    its JSON text the same way. Without a schema for the property the value is kept.
    """

    def __init__(self, tools: Tools | None) -> None:
        self._properties: dict[str, Mapping[str, Any]] = {}
        for tool in tools or ():
            spec = tool.get("function", tool)
            if isinstance(spec, Mapping) and isinstance(spec.get("name"), str):
                params = spec.get("parameters") or spec.get("input_schema") or {}
                props = params.get("properties") if isinstance(params, Mapping) else None
                self._properties.setdefault(spec["name"], props if isinstance(props, Mapping) else {})

    def known(self, name: str) -> bool:
        """Whether ``name`` is one of the request's tools (True when the request names none)."""
        return not self._properties or name in self._properties

    def apply(self, name: str, arguments: dict[str, Any]) -> dict[str, Any]:
        properties = self._properties.get(name)
        if not properties:
            return arguments
        return {key: _typed(value, properties.get(key)) for key, value in arguments.items()}


_ALIASES = {"str": "string", "text": "string", "int": "integer", "float": "number", "double": "number"}
_ALIASES |= {"bool": "boolean", "dict": "object", "list": "array", "arr": "array", "long": "integer"}
_ORDER = ("null", "integer", "number", "boolean", "object", "array", "string")


def _typed(value: Any, schema: object) -> Any:
    if not isinstance(schema, Mapping):
        return value
    if isinstance(value, dict):
        props = schema.get("properties")
        if isinstance(props, Mapping):
            return {k: _typed(v, props.get(k)) for k, v in value.items()}
        return value
    if isinstance(value, list):
        items = schema.get("items")
        return [_typed(v, items) for v in value] if isinstance(items, Mapping) else value
    text = value if isinstance(value, str) else dumps(value)
    return _coerce(text, _types(schema))


def _types(schema: Mapping[str, Any]) -> set[str]:
    found: set[str] = set()
    kind = schema.get("type")
    for name in [kind] if isinstance(kind, str) else kind if isinstance(kind, list) else []:
        if isinstance(name, str):
            found.add(name)
    enum = schema.get("enum")
    for member in enum if isinstance(enum, list) else []:
        found.add(_json_type(member))
    for key in ("anyOf", "oneOf", "allOf"):
        for choice in schema.get(key) or []:
            if isinstance(choice, Mapping):
                found |= _types(choice)
    return found or {"string"}


def _json_type(value: object) -> str:
    if value is None:
        return "null"
    for kind, name in ((bool, "boolean"), (int, "integer"), (float, "number"), (str, "string"), (list, "array")):
        if isinstance(value, kind):
            return name
    return "object"


def _coerce(text: str, types: set[str]) -> Any:
    wanted = {_ALIASES.get(t.strip().lower(), t.strip().lower()) for t in types}
    for kind in _ORDER:
        if kind not in wanted:
            continue
        if kind == "string":
            return text
        value = _as(kind, text)
        if value is not _NO:
            return value
    try:
        parsed = json.loads(text)
    except ValueError:
        return text
    return parsed if _finite(parsed) else text


_NO = object()


def _as(kind: str, text: str) -> Any:
    if kind == "null":
        return None if text.lower() == "null" else _NO
    if kind == "boolean":
        word = text.lower().strip()
        return True if word in ("true", "1") else False if word in ("false", "0") else _NO
    try:
        if kind == "integer":
            return int(text)
        if kind == "number":
            number = float(text)
            if not math.isfinite(number):
                return _NO
            return int(number) if number == int(number) else number
        parsed = json.loads(text)
    except ValueError:
        return _NO
    return parsed if _finite(parsed) else _NO


def _finite(value: Any) -> bool:
    if isinstance(value, float):
        return math.isfinite(value)
    if isinstance(value, list):
        return all(_finite(v) for v in value)
    if isinstance(value, dict):
        return all(_finite(v) for v in value.values())
    return True
