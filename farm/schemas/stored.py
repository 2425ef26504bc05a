"""What a request may hand the farm to keep: only what PostgreSQL can store and the API can serve back.

Every text and JSON field of a request model that reaches the database is one of these types, so
the rule lives here once:

- ``StoredStr``: no NUL (no PostgreSQL text holds one) and no unpaired UTF-16 surrogate (what a JSON
  escape like ``"\\udfff"`` decodes to: no UTF-8 can encode it, so an answer holding it fails);
- ``StoredJson``, ``StoredMetadata``: an object whose strings and keys obey the same, whose
  numbers are finite (NaN, Infinity and ``1e400``, which Python reads as infinity, are no JSON),
  nested at most ``MAX_JSON_DEPTH`` deep (metadata: at most ``MAX_METADATA_BYTES`` as JSON);
- ``WholeInt``: an integer as JSON Schema means it, any number without a fractional part
  (``445.0`` is 445), never a string or a boolean.

The OpenAPI schema says the same where JSON Schema can: a text's pattern refuses NUL. JSON has no
NaN and a lone surrogate is no Unicode text, so neither is in what the schema allows; the depth and
size limits are in the fields' descriptions and docs/api.md.
"""

from __future__ import annotations

import json
import math
import re
from typing import Annotated, Any

from pydantic import AfterValidator, BeforeValidator, Strict, StringConstraints

#: JSON nested deeper than this (objects and arrays) is refused: no trainer's metadata or task
#: config is that deep, and every reader after us (json, psycopg, pydantic) recurses.
MAX_JSON_DEPTH = 64
#: the most a request's ``metadata`` may hold, as compact JSON: it comes back with every status.
MAX_METADATA_BYTES = 64 * 1024
#: a string's JSON Schema pattern: no NUL (the only rule of ``StoredStr`` a pattern can say).
NO_NUL_PATTERN = r"^[^\x00]*$"
#: a 64-bit signed integer's bounds: what a seed or token id may be anywhere after us.
INT64_MIN, INT64_MAX = -(2**63), 2**63 - 1
#: an unpaired UTF-16 surrogate in a Python string (a paired one is read as the character it encodes).
_SURROGATE = re.compile("[\ud800-\udfff]")
#: the JSON escape of a UTF-16 surrogate (paired or not) in a JSON text.
_SURROGATE_ESCAPE = re.compile(r"\\u[dD][89a-fA-F]")
#: the OpenAPI description of a ``StoredMetadata`` field.
METADATA_ABOUT = (
    f"the trainer's own, served back as given: JSON with finite numbers and text without NUL, nested at most "
    f"{MAX_JSON_DEPTH} deep, at most {MAX_METADATA_BYTES} bytes"
)


def text_problem(value: str) -> str | None:
    """Why ``value`` cannot be stored and served back, or None."""
    if "\x00" in value:
        return "holds a NUL character, which no stored text may hold"
    try:
        value.encode("utf-8")
    except UnicodeEncodeError as exc:
        return f"holds an unpaired UTF-16 surrogate ({value[exc.start]!r} at {exc.start}), which is no text"
    return None


def _where(path: list[str]) -> str:
    return f" at {'.'.join(path)}" if path else ""


def _check_node(value: Any, path: list[str], depth: int) -> None:
    """Raise ValueError naming where ``value`` (a node ``depth`` deep) breaks a rule of the module."""
    if isinstance(value, str):
        problem = text_problem(value)
        if problem:
            raise ValueError(f"a string{_where(path)} {problem}")
    elif isinstance(value, float):
        if not math.isfinite(value):
            raise ValueError(f"the number{_where(path)} is {value}: only finite numbers are JSON")
    elif isinstance(value, dict | list):
        if depth >= MAX_JSON_DEPTH:
            raise ValueError(f"nested too deep{_where(path)}: at most {MAX_JSON_DEPTH} levels of objects and arrays")
        items = value.items() if isinstance(value, dict) else enumerate(value)
        for key, item in items:
            if isinstance(key, str):
                problem = text_problem(key)
                if problem:
                    raise ValueError(f"the key {key!r}{_where(path)} {problem}")
            _check_node(item, [*path, str(key)], depth + 1)


def check_json(value: Any, max_bytes: int | None = None) -> Any:
    """``value`` if it can be stored and served back (see the module docstring), else ValueError."""
    _check_node(value, [], 0)
    if max_bytes is not None:
        size = len(json.dumps(value, separators=(",", ":"), ensure_ascii=False).encode())
        if size > max_bytes:
            raise ValueError(f"{size} bytes as JSON: at most {max_bytes} bytes")
    return value


def loads_stored(text: str | bytes) -> Any:
    """A stored JSON text read back, with any unpaired UTF-16 surrogate in it replaced by U+FFFD.

    Nothing accepted now holds one, but a batch or trial stored before these rules may (PostgreSQL's
    ``json`` keeps the escape ``"\\udfff"`` as written): read as is, no answer could carry it (a 500
    on every read). Only a text holding such an escape is walked.
    """
    value = json.loads(text)
    if isinstance(text, bytes):
        text = text.decode("utf-8")
    return _servable(value) if _SURROGATE_ESCAPE.search(text) else value


def _servable(value: Any) -> Any:
    if isinstance(value, str):
        return _SURROGATE.sub("\ufffd", value)
    if isinstance(value, list):
        return [_servable(item) for item in value]
    if isinstance(value, dict):
        return {_servable(key): _servable(item) for key, item in value.items()}
    return value


def _json(value: Any) -> Any:
    return check_json(value)


def _metadata(value: Any) -> Any:
    return check_json(value, MAX_METADATA_BYTES)


def _whole(value: Any) -> Any:
    # A float with no fractional part is the integer JSON Schema says it is; the rest goes on to
    # the strict int check, which refuses it (and strings and booleans) by name.
    if isinstance(value, float) and value.is_integer():
        return int(value)
    return value


#: The pattern refuses a NUL. A lone surrogate is refused by pydantic-core itself: a string with a
#: constraint is read as UTF-8 to check it, which fails (``string_unicode``). Both are checked on the
#: string schema itself, so a field's own length limits keep their plain messages.
StoredStr = Annotated[str, StringConstraints(pattern=NO_NUL_PATTERN)]
#: a JSON object bounded only by the request body's limit (a task's config).
StoredJson = Annotated[dict[str, Any], AfterValidator(_json)]
#: a request's ``metadata``: served back with every read of its batch or trial, so kept small.
StoredMetadata = Annotated[dict[str, Any], AfterValidator(_metadata)]
WholeInt = Annotated[int, BeforeValidator(_whole), Strict()]
