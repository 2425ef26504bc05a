"""Every tool-call format reads its table of model outputs (``parser_cases``) the same, whole or streamed.

Streamed means: cut in two at every position, in chunks of 1, 2 and 3 characters at every phase, and
in seeded random chunkings of 1-3 characters; each must give exactly the pieces the whole text gives
(adjacent prose joined: how prose is cut into pieces is the stream's business).
"""

from __future__ import annotations

import json
import random
from collections.abc import Iterator

import pytest

from farm.proxy.parsers import TOOL_CALL_PARSERS
from farm.proxy.toolparse import CallPiece, Piece, TextPiece, ToolCallParser
from farm.proxy.toolparse.scan import SchemaTypes, merge
from tests.unit.proxy.parser_case_kit import ToolCase
from tests.unit.proxy.parser_cases import TOOL_CASES
from tests.unit.proxy.parser_samples import SAMPLES

RANDOM_CHUNKINGS = 20


def new_parser(case: ToolCase) -> ToolCallParser:
    """The case's parser, given the request's tools."""
    return TOOL_CALL_PARSERS[case.parser](tools=case.tools)


def parse(case: ToolCase, chunks: list[str]) -> list[Piece]:
    parser = new_parser(case)
    pieces: list[Piece] = []
    for chunk in chunks:
        pieces.extend(parser.push(chunk))
    pieces.extend(parser.finish())
    return merge(pieces)


def chunkings(text: str) -> Iterator[list[str]]:
    for cut in range(1, len(text)):
        yield [text[:cut], text[cut:]]
    for size in (1, 2, 3):
        for phase in range(size):
            yield [text[:phase]] + [text[i : i + size] for i in range(phase, len(text), size)]
    rng = random.Random(len(text))
    for _ in range(RANDOM_CHUNKINGS):
        chunks, at = [], 0
        while at < len(text):
            step = rng.randint(1, 3)
            chunks.append(text[at : at + step])
            at += step
        yield chunks


def calls_and_prose(pieces: list[Piece]) -> tuple[list[tuple[str, object]], str]:
    calls = [(p.name, json.loads(p.arguments)) for p in pieces if isinstance(p, CallPiece)]
    return calls, "".join(p.text for p in pieces if isinstance(p, TextPiece))


def case_id(case: ToolCase) -> str:
    return f"{case.parser}:{case.name}"


@pytest.mark.parametrize("case", TOOL_CASES, ids=case_id)
def test_toolparse_reads_the_calls_and_prose_of_a_whole_answer(case: ToolCase) -> None:
    assert calls_and_prose(parse(case, [case.text])) == (case.calls, case.prose)


@pytest.mark.parametrize("case", TOOL_CASES, ids=case_id)
def test_toolparse_streamed_in_any_chunking_gives_the_same_pieces(case: ToolCase) -> None:
    whole = parse(case, [case.text])
    for chunks in chunkings(case.text):
        assert parse(case, chunks) == whole, chunks


@pytest.mark.parametrize("case", [c for c in TOOL_CASES if c.calls and "unclosed" not in c.name], ids=case_id)
def test_toolparse_hands_each_call_on_once_it_is_complete(case: ToolCase) -> None:
    parser = new_parser(case)
    assert calls_and_prose(parser.push(case.text))[0] == case.calls


PROSE = {"openai": ("<|channel|>final<|message|>", "Hello world.")}


@pytest.mark.parametrize("name", sorted(TOOL_CALL_PARSERS))
def test_toolparse_hands_prose_on_as_it_comes(name: str) -> None:
    markup, prose = PROSE.get(name, ("", "Hello world."))
    assert TOOL_CALL_PARSERS[name]().push(markup + prose) == [TextPiece(prose)]


def test_toolparse_every_format_is_registered_by_vllms_name() -> None:
    names = {"hermes", "qwen3_coder", "llama3_json", "deepseek_v31", "glm45", "kimi_k2", "mistral", "openai"}
    assert names <= set(TOOL_CALL_PARSERS)


def test_schema_types_follow_vllms_order_of_types() -> None:
    tools = [
        {
            "type": "function",
            "function": {
                "name": "f",
                "parameters": {
                    "properties": {
                        "n": {"type": ["integer", "string"]},
                        "s": {"type": "string"},
                        "b": {"type": "boolean"},
                        "e": {"enum": [1, 2]},
                        "x": {"anyOf": [{"type": "null"}, {"type": "number"}]},
                        "inf": {"type": "number"},
                    }
                },
            },
        }
    ]
    typed = SchemaTypes(tools).apply("f", {"n": "7", "s": 7, "b": "0", "e": "2", "x": "null", "inf": "inf", "k": "1"})
    assert typed == {"n": 7, "s": "7", "b": False, "e": 2, "x": None, "inf": "inf", "k": "1"}


@pytest.mark.parametrize("case", SAMPLES, ids=case_id)
def test_toolparse_reads_sampled_answers_whole_and_streamed(case: ToolCase) -> None:
    whole = parse(case, [case.text])
    assert calls_and_prose(whole) == (case.calls, case.prose)
    rng = random.Random(case.name)
    for _ in range(5):
        chunks, at = [], 0
        while at < len(case.text):
            step = rng.randint(1, 3)
            chunks.append(case.text[at : at + step])
            at += step
        assert parse(case, chunks) == whole, chunks


@pytest.mark.parametrize(
    "tool",
    [
        {"type": "function", "function": {"name": "f", "parameters": {"properties": {"n": {"type": "integer"}}}}},
        {"type": "function", "name": "f", "parameters": {"properties": {"n": {"type": "integer"}}}},
        {"name": "f", "input_schema": {"properties": {"n": {"type": "integer"}}}},
    ],
    ids=["chat", "responses", "anthropic"],
)
def test_schema_types_read_the_tools_of_every_wire_format(tool: dict) -> None:
    assert SchemaTypes([tool]).apply("f", {"n": "3"}) == {"n": 3}
