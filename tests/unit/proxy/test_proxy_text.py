"""Tool-call splitting, stop strings and incremental detokenization: streamed pieces equal the whole."""

from __future__ import annotations

from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from farm.proxy.parsers import tool_call_parser
from farm.proxy.text import StopMatcher, TextDecoder
from farm.proxy.toolparse import CallPiece, TextPiece
from farm.proxy.toolparse.hermes import parse_call

CALL = '<tool_call>\n{"name": "bash", "arguments": {"command": "ls"}}\n</tool_call>'


def _pieces(chunks: list[str], *, parse_calls: bool = True) -> list[Any]:
    splitter = tool_call_parser("hermes", parse_calls=parse_calls)
    out: list[Any] = []
    for chunk in chunks:
        out += splitter.push(chunk)
    out += splitter.finish()
    merged: list[Any] = []
    for piece in out:
        if isinstance(piece, TextPiece) and merged and isinstance(merged[-1], TextPiece):
            merged[-1] = TextPiece(merged[-1].text + piece.text)
        else:
            merged.append(piece)
    return merged


def test_splitter_separates_prose_and_calls() -> None:
    assert _pieces([f"Let me look.{CALL} then {CALL}"]) == [
        TextPiece("Let me look."),
        CallPiece("bash", '{"command": "ls"}'),
        TextPiece(" then "),
        CallPiece("bash", '{"command": "ls"}'),
    ]


def test_splitter_keeps_a_malformed_block_as_prose() -> None:
    broken = '<tool_call>{"name": "bash", "arguments": [1]}</tool_call>'
    assert _pieces([f"a{broken}b"]) == [TextPiece(f"a{broken}b")]
    assert _pieces(["a<tool_call>{never closed"]) == [TextPiece("a<tool_call>{never closed")]


def test_splitter_without_tools_returns_everything_as_text() -> None:
    assert _pieces([CALL], parse_calls=False) == [TextPiece(CALL)]


@settings(max_examples=200, deadline=None)
@given(st.lists(st.integers(min_value=0, max_value=len(CALL) * 2 + 10), max_size=6))
def test_splitter_gives_the_same_pieces_however_the_text_is_cut(cuts: list[int]) -> None:
    text = f"pre <tool{CALL}mid{CALL}<tool_"
    bounds = sorted({0, len(text), *[c % (len(text) + 1) for c in cuts]})
    chunks = [text[a:b] for a, b in zip(bounds, bounds[1:], strict=False)]
    assert _pieces(chunks) == _pieces([text])


def test_parse_call_accepts_arguments_as_a_json_string() -> None:
    assert parse_call('{"name": "f", "arguments": "{\\"x\\": 1}"}') == CallPiece("f", '{"x": 1}')
    assert parse_call('{"name": "", "arguments": {}}') is None
    assert parse_call("not json") is None


def test_stop_matcher_cuts_at_the_first_stop_string_across_pieces() -> None:
    stops = StopMatcher(["END", "\n\n"])
    out = []
    for piece in ["hello E", "N", "D world"]:
        text, hit = stops.push(piece)
        out.append(text)
        if hit:
            break
    assert "".join(out) == "hello " and hit == "END"


def test_stop_matcher_releases_held_text_at_the_end() -> None:
    stops = StopMatcher(["STOP"])
    assert stops.push("abcST") == ("ab", None)
    assert stops.push("", final=True) == ("cST", None)


def test_text_decoder_never_splits_a_character(tiny_tokenizer: Any) -> None:
    text = "naïve café 中文 🙂 done"
    ids = tiny_tokenizer.encode(text, add_special_tokens=False)
    decoder = TextDecoder(tiny_tokenizer)
    pieces = [decoder.push([token]) for token in ids] + [decoder.flush()]
    assert "".join(pieces) == text
    assert all("\ufffd" not in piece for piece in pieces)


def test_text_decoder_hides_the_end_of_turn_id(tiny_tokenizer: Any) -> None:
    ids = tiny_tokenizer.encode("hi", add_special_tokens=False) + [tiny_tokenizer.eos_token_id]
    decoder = TextDecoder(tiny_tokenizer, hidden_ids={tiny_tokenizer.eos_token_id})
    assert decoder.push(ids) + decoder.flush() == "hi"


@settings(max_examples=100, deadline=None)
@given(st.lists(st.integers(min_value=1, max_value=6), min_size=1, max_size=30))
def test_text_decoder_shows_each_character_once_its_ids_arrive_however_they_are_grouped(
    tiny_tokenizer: Any, sizes: list[int]
) -> None:
    text = "naïve café 中文 🙂 done, and 🙂🙂 again"
    ids = tiny_tokenizer.encode(text, add_special_tokens=False)
    decoder = TextDecoder(tiny_tokenizer)
    shown, at = "", 0
    for size in sizes * len(ids):
        if at >= len(ids):
            break
        at += size
        piece = decoder.push(ids[at - size : at])
        assert "\ufffd" not in piece
        shown += piece
        assert shown == tiny_tokenizer.decode(ids[:at]).rstrip("\ufffd")
    assert shown + decoder.flush() == text
