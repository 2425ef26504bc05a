"""The proxy's seams: each wire format behind one ``WireFormat``, the parsers chosen by name."""

from __future__ import annotations

import pytest

from farm.config import ProxySettings
from farm.errors import ConfigError, ProxyError
from farm.proxy.errors import CONTEXT_LENGTH
from farm.proxy.parsers import ParserNames, choose, reasoning_parser, tool_call_parser
from farm.proxy.reasoning import Split
from farm.proxy.routes import FORMATS
from farm.proxy.toolparse import CallPiece, TextPiece
from farm.proxy.wire import WireRequest

#: the smallest body each format serves.
BODIES = {
    "/chat/completions": {"messages": [{"role": "user", "content": "hi"}], "stream": True},
    "/completions": {"prompt": "hi", "echo": True, "stream_options": {"include_usage": True}},
    "/responses": {"input": "hi", "tools": [{"type": "web_search"}]},
    "/messages": {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 5},
}


@pytest.mark.parametrize("path", sorted(BODIES))
def test_wire_format_parses_to_one_request_type(path: str) -> None:
    parsed = FORMATS[path].parse(BODIES[path])
    assert isinstance(parsed, WireRequest)
    assert parsed.call.sampling.max_tokens in (None, 5, 16)


def test_wire_formats_keep_what_their_answers_need() -> None:
    assert FORMATS["/chat/completions"].parse(BODIES["/chat/completions"]).call.stream
    completions = FORMATS["/completions"].parse(BODIES["/completions"])
    assert (completions.echo_prompt, completions.include_usage) == (True, True)
    assert FORMATS["/responses"].parse(BODIES["/responses"]).echo["tools"] == [{"type": "web_search"}]


def test_wire_formats_are_recorded_under_names_of_their_own() -> None:
    assert len({f.wire for f in FORMATS.values()}) == len(FORMATS)
    assert FORMATS["/messages"].call_id_prefix == "toolu_"


def test_wire_format_error_bodies_name_the_formats_own_fields() -> None:
    empty = ProxyError(400, "messages must not be empty", param="messages")
    assert FORMATS["/responses"].error_body(empty)["error"] == {
        "message": "input must not be empty",
        "type": "invalid_request_error",
        "param": "input",
        "code": None,
    }
    too_long = ProxyError(400, "too long", param="messages", code=CONTEXT_LENGTH)
    assert FORMATS["/completions"].error_body(too_long)["error"]["param"] == "prompt"
    assert FORMATS["/messages"].error_body(ProxyError(400, "too long", code=CONTEXT_LENGTH)) == {
        "type": "error",
        "error": {"type": "invalid_request_error", "message": "prompt is too long: too long"},
    }


def test_parsers_a_model_of_no_known_family_writes_hermes_calls_and_no_reasoning() -> None:
    assert choose(ProxySettings(), "{{ messages }}") == ParserNames(tool_calls="hermes", reasoning="none")


def test_parsers_unknown_names_are_refused_with_the_known_ones() -> None:
    with pytest.raises(ConfigError, match="known: .*hermes.*qwen3_coder"):
        tool_call_parser("pythonic", parse_calls=True)
    with pytest.raises(ConfigError, match="known: .*deepseek_r1.*none"):
        reasoning_parser("granite")


def test_parsers_hermes_reads_calls_and_plain_text_reads_none() -> None:
    text = '<tool_call>{"name": "f", "arguments": {}}</tool_call>'
    assert tool_call_parser("hermes", parse_calls=True).push(text) == [CallPiece("f", "{}")]
    assert tool_call_parser("hermes", parse_calls=False).push(text) == [TextPiece(text)]


def test_parsers_no_reasoning_passes_the_text_through() -> None:
    parser = reasoning_parser("none")
    assert parser.push("<think>x</think>y") == Split(content="<think>x</think>y")
    assert parser.finish() == Split()


def test_parsers_are_made_with_the_requests_tools_so_values_get_the_schemas_types() -> None:
    tools = [{"name": "f", "parameters": {"type": "object", "properties": {"n": {"type": "integer"}}}}]
    text = "<tool_call>\n<function=f>\n<parameter=n>\n3\n</parameter>\n</function>\n</tool_call>"
    typed = tool_call_parser("qwen3_coder", parse_calls=True, tools=tools)
    assert typed.push(text) + typed.finish() == [CallPiece("f", '{"n": 3}')]
    untyped = tool_call_parser("qwen3_coder", parse_calls=True)
    assert untyped.push(text) + untyped.finish() == [CallPiece("f", '{"n": "3"}')]
