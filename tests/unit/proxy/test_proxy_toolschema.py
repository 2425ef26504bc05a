"""Tool schemas checked as JSON Schema: what is refused, what is allowed, and each format's 400."""

from __future__ import annotations

from typing import Any

import pytest

from farm.errors import ProxyError
from farm.proxy import anthropic_messages, openai_chat, openai_responses
from farm.proxy.toolschema import MAX_DEPTH, schema_problem

USER = [{"role": "user", "content": "hi"}]
GOOD: list[Any] = [
    {},
    {"type": "object"},
    {"type": "object", "properties": {"command": {"type": "string"}}, "required": ["command"]},
    {"type": "object", "properties": {"n": {"type": ["integer", "null"], "minimum": 0, "multipleOf": 2}}},
    {"type": "object", "properties": {"xs": {"type": "array", "items": {"type": "string"}, "minItems": 1}}},
    {"type": "object", "properties": {"xs": {"type": "array", "items": [{"type": "string"}, True]}}},
    {"type": "object", "properties": {"x": {"anyOf": [{"type": "string"}, {"$ref": "#/$defs/y"}]}}, "$defs": {"y": {}}},
    {"type": "object", "additionalProperties": False, "x-unknown-keyword": {"anything": 1}},
    {"type": "object", "properties": {"mode": {"enum": ["a", "b"], "description": "how"}}},
    # draft 4's boolean exclusiveMinimum, as older schema generators write it
    {"type": "object", "properties": {"n": {"type": "number", "minimum": 0, "exclusiveMinimum": True}}},
]
#: (schema, words the problem names)
BAD: list[tuple[Any, list[str]]] = [
    ("x", ["must be a JSON object", "a string"]),
    ([], ["must be a JSON object", "an array"]),
    ({"type": "string"}, ['type: "object"', "'string'"]),
    ({"type": "object", "properties": {"x": {"type": "nonsense-type"}}}, ["'nonsense-type'", "('properties', 'x')"]),
    ({"type": "object", "properties": {"x": {"type": []}}}, ["'type'"]),
    ({"type": "object", "properties": {"x": {"type": ["string", "string"]}}}, ["distinct"]),
    ({"type": "object", "required": "command"}, ["'required' must be an array of strings"]),
    ({"type": "object", "required": [1]}, ["'required' must be an array of strings"]),
    ({"type": "object", "properties": []}, ["'properties' must be an object"]),
    ({"type": "object", "properties": {"x": 5}}, ["a schema must be an object or a boolean", "('properties', 'x')"]),
    ({"type": "object", "properties": {"x": {"type": "array", "items": 3}}}, ["('properties', 'x', 'items')"]),
    ({"type": "object", "anyOf": []}, ["'anyOf' must be a non-empty array"]),
    ({"type": "object", "properties": {"x": {"type": "string", "minLength": -1}}}, ["'minLength'"]),
    ({"type": "object", "properties": {"x": {"type": "number", "multipleOf": 0}}}, ["'multipleOf'"]),
    ({"type": "object", "properties": {"x": {"type": "number", "minimum": "0"}}}, ["'minimum'"]),
    ({"type": "object", "properties": {"x": {"type": "number", "maximum": True}}}, ["'maximum'"]),
    ({"type": "object", "properties": {"x": {"enum": "a"}}}, ["'enum' must be an array"]),
    ({"type": "object", "description": 5}, ["'description' must be a string"]),
]


def _nested(depth: int) -> dict[str, Any]:
    schema: dict[str, Any] = {"type": "string"}
    for _ in range(depth):
        schema = {"type": "object", "properties": {"x": schema}}
    return schema


@pytest.mark.parametrize("schema", GOOD)
def test_a_valid_schema_passes(schema: Any) -> None:
    assert schema_problem(schema) is None


@pytest.mark.parametrize(("schema", "words"), BAD, ids=[str(i) for i in range(len(BAD))])
def test_an_invalid_schema_is_named_with_where_and_what(schema: Any, words: list[str]) -> None:
    problem = schema_problem(schema)
    assert problem is not None
    for word in words:
        assert word in str(problem), str(problem)


def test_nesting_is_bounded() -> None:
    assert schema_problem(_nested(MAX_DEPTH)) is None
    problem = schema_problem(_nested(MAX_DEPTH + 1))
    assert problem is not None and "deeper" in str(problem)


def _chat(parameters: Any) -> dict[str, Any]:
    tools = [
        {"type": "function", "function": {"name": "ok", "parameters": {"type": "object"}}},
        {"type": "function", "function": {"name": "bash", "parameters": parameters}},
    ]
    return {"messages": USER, "tools": tools}


NONSENSE = {"type": "object", "properties": {"command": {"type": "nonsense-type"}}}


def test_chat_completions_answers_openai_s_400_naming_the_tool() -> None:
    with pytest.raises(ProxyError) as caught:
        openai_chat.parse(_chat(NONSENSE))
    error = caught.value
    assert error.status == 400
    assert error.param == "tools[1].function.parameters"
    assert error.code == "invalid_function_parameters"
    assert error.message.startswith(
        "Invalid schema for function 'bash' (tools[1].function.parameters): In context=('properties', 'command')"
    )
    assert "'nonsense-type'" in error.message
    # parameters may be left out (OpenAI allows it), or null
    openai_chat.parse({"messages": USER, "tools": [{"type": "function", "function": {"name": "bash"}}]})
    openai_chat.parse(_chat(None))


def test_responses_answers_openai_s_400_naming_the_tool() -> None:
    tools = [
        {"type": "web_search"},
        {"type": "function", "name": "bash", "parameters": {"type": "object", "required": "x"}},
    ]
    with pytest.raises(ProxyError) as caught:
        openai_responses.parse({"input": "hi", "tools": tools})
    error = caught.value
    assert (error.status, error.param, error.code) == (400, "tools[1].parameters", "invalid_function_parameters")
    assert "'bash' (tools[1].parameters)" in error.message and "'required' must be an array of strings" in error.message


def test_anthropic_answers_its_400_naming_the_tool() -> None:
    tools = [{"name": "ok", "input_schema": {"type": "object"}}, {"name": "bash", "input_schema": NONSENSE}]
    body = {"max_tokens": 4, "messages": USER, "tools": tools}
    for parse in (anthropic_messages.parse, anthropic_messages.parse_count):
        with pytest.raises(ProxyError) as caught:
            parse(body)
        error = caught.value
        assert error.status == 400
        assert error.message.startswith("tools.1.custom.input_schema: JSON schema is invalid.")
        assert "Tool 'bash'" in error.message and "'nonsense-type'" in error.message
        assert anthropic_messages.error_body(error.status, error.message)["error"]["type"] == "invalid_request_error"
