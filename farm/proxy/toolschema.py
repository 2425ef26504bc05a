"""A tool's parameters checked as a JSON Schema before the model sees them (OpenAI and Anthropic
answer an invalid one with a 400; a template would render it as it is and the model read nonsense).

``schema_problem`` is a small check of the shapes the JSON Schema metaschema gives its keywords
(draft 2020-12; draft 7's ``items`` arrays and ``definitions`` and draft 4's boolean
``exclusiveMinimum`` too): known ``type`` names, ``required`` an array of strings, ``properties`` an
object of schemas, subschemas objects or booleans, counts non-negative integers, nesting bounded.
Unknown keywords are allowed, as the metaschema allows them. It says what is wrong and where (the
path of keywords, as OpenAI's ``In context=(...)``).
"""

from __future__ import annotations

from typing import Any

from farm.errors import ProxyError

TYPES = ("null", "boolean", "object", "array", "number", "string", "integer")
#: deepest nesting of subschemas read (a schema is data a harness sent: no unbounded recursion).
MAX_DEPTH = 64
#: keywords whose value is one schema.
_ONE = (
    "additionalProperties",
    "additionalItems",
    "contains",
    "propertyNames",
    "not",
    "if",
    "then",
    "else",
    "unevaluatedProperties",
    "unevaluatedItems",
)
#: keywords whose value is an object of schemas.
_MAP = ("properties", "patternProperties", "$defs", "definitions", "dependentSchemas")
#: keywords whose value is a non-empty array of schemas.
_MANY = ("allOf", "anyOf", "oneOf", "prefixItems")
_COUNTS = (
    "minLength",
    "maxLength",
    "minItems",
    "maxItems",
    "minProperties",
    "maxProperties",
    "minContains",
    "maxContains",
)
_NUMBERS = ("minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum")
#: draft 4's boolean form, which harnesses' schema generators still write.
_BOOLEAN_TOO = ("exclusiveMinimum", "exclusiveMaximum")
_STRINGS = ("title", "description", "pattern", "format", "$ref", "$id", "$schema", "$anchor", "$comment")


class SchemaProblem(ValueError):
    """What is wrong with a schema (``str``), and where: the keywords leading to it."""

    def __init__(self, context: tuple[str, ...], problem: str) -> None:
        super().__init__(problem)
        self.context = context
        self.problem = problem

    def __str__(self) -> str:
        return f"In context={self.context!r}, {self.problem}"


def schema_problem(schema: Any, *, top_object: bool = True) -> SchemaProblem | None:
    """What makes ``schema`` an invalid tool parameters schema (None: nothing).

    ``top_object``: the schema must describe an object (a ``type`` other than ``object`` at the top
    is refused; none at all is allowed, as OpenAI allows it).
    """
    if not isinstance(schema, dict):
        return SchemaProblem((), f"the schema must be a JSON object, got {_kind(schema)}")
    if top_object and "type" in schema and schema["type"] != "object":
        return SchemaProblem((), f"schema must be a JSON Schema of 'type: \"object\"', got 'type: {schema['type']!r}'")
    try:
        _check(schema, (), 0)
    except SchemaProblem as problem:
        return problem
    return None


def check_function(parameters: Any, *, name: str, param: str) -> None:
    """An OpenAI function tool's ``parameters`` (Chat Completions and Responses), checked as OpenAI does.

    Raises:
        ProxyError: 400 ``invalid_function_parameters`` naming the tool, where it is (``param``) and the problem.
    """
    problem = schema_problem(parameters)
    if problem is not None:
        raise ProxyError(
            400,
            f"Invalid schema for function {name!r} ({param}): {problem}.",
            param=param,
            code="invalid_function_parameters",
        )


def _kind(value: Any) -> str:
    names = {dict: "an object", list: "an array", str: "a string", bool: "a boolean", type(None): "null"}
    return names.get(type(value), "a number")


def _check(schema: Any, at: tuple[str, ...], depth: int) -> None:
    if isinstance(schema, bool):
        return
    if not isinstance(schema, dict):
        raise SchemaProblem(at, f"a schema must be an object or a boolean, got {_kind(schema)}")
    if depth > MAX_DEPTH:
        raise SchemaProblem(at, f"the schema nests deeper than {MAX_DEPTH} levels")
    if "type" in schema:
        _check_type(schema["type"], at)
    if "required" in schema:
        required = schema["required"]
        if not isinstance(required, list) or not all(isinstance(r, str) for r in required):
            raise SchemaProblem(at, f"'required' must be an array of strings, got {required!r}")
    if "enum" in schema and not isinstance(schema["enum"], list):
        raise SchemaProblem(at, f"'enum' must be an array, got {_kind(schema['enum'])}")
    for key in _STRINGS:
        if key in schema and not isinstance(schema[key], str):
            raise SchemaProblem(at, f"{key!r} must be a string, got {_kind(schema[key])}")
    for key in _COUNTS:
        value = schema.get(key)
        if key in schema and (not isinstance(value, int) or isinstance(value, bool) or value < 0):
            raise SchemaProblem(at, f"{key!r} must be a non-negative integer, got {value!r}")
    for key in _NUMBERS:
        value = schema.get(key)
        if key in schema and not isinstance(value, int | float):
            raise SchemaProblem(at, f"{key!r} must be a number, got {value!r}")
        if isinstance(value, bool) and key not in _BOOLEAN_TOO:
            raise SchemaProblem(at, f"{key!r} must be a number, got {value!r}")
    if "multipleOf" in schema:
        value = schema["multipleOf"]
        if not isinstance(value, int | float) or isinstance(value, bool) or value <= 0:
            raise SchemaProblem(at, f"'multipleOf' must be a number above 0, got {value!r}")
    for key in _ONE:
        if key in schema:
            _check(schema[key], (*at, key), depth + 1)
    for key in _MAP:
        if key in schema:
            value = schema[key]
            if not isinstance(value, dict):
                raise SchemaProblem(at, f"{key!r} must be an object, got {_kind(value)}")
            for name, sub in value.items():
                _check(sub, (*at, key, name), depth + 1)
    for key in _MANY:
        if key in schema:
            value = schema[key]
            if not isinstance(value, list) or not value:
                raise SchemaProblem(at, f"{key!r} must be a non-empty array of schemas, got {value!r}")
            for i, sub in enumerate(value):
                _check(sub, (*at, key, str(i)), depth + 1)
    if "items" in schema:  # a schema, or (draft 7) an array of them
        items = schema["items"]
        if isinstance(items, list):
            for i, sub in enumerate(items):
                _check(sub, (*at, "items", str(i)), depth + 1)
        else:
            _check(items, (*at, "items"), depth + 1)


def _check_type(value: Any, at: tuple[str, ...]) -> None:
    names = value if isinstance(value, list) else [value]
    if not names or (isinstance(value, list) and len(set(map(repr, names))) != len(names)):
        raise SchemaProblem(at, f"'type' must be a type name or a non-empty array of distinct ones, got {value!r}")
    for name in names:
        if name not in TYPES:
            raise SchemaProblem(at, f"'type' {name!r} is not one of {', '.join(TYPES)}")
