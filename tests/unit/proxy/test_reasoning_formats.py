"""Every reasoning format splits its table of model outputs (``parser_cases``) the same, whole or streamed."""

from __future__ import annotations

import pytest

from farm.proxy.parsers import REASONING_PARSERS, TOOL_CALL_PARSERS
from farm.proxy.reasoning import Split
from farm.proxy.toolparse import TextPiece
from tests.unit.proxy.parser_case_kit import ReasoningCase
from tests.unit.proxy.reasoning_cases import REASONING_CASES
from tests.unit.proxy.test_toolparse_formats import chunkings


def split(case: ReasoningCase, chunks: list[str]) -> tuple[str, str]:
    make = REASONING_PARSERS[case.parser]
    parser = make() if case.thinking else make(thinking=False)  # type: ignore[call-arg]
    parts: list[Split] = [parser.push(chunk) for chunk in chunks] + [parser.finish()]
    return "".join(p.reasoning for p in parts), "".join(p.content for p in parts)


def answer_text(case: ReasoningCase, content: str) -> str:
    """gpt-oss's content is harmony still: its final text is what the ``openai`` parser reads from it."""
    if case.parser != "openai_gptoss":
        return content
    parser = TOOL_CALL_PARSERS["openai"]()
    pieces = parser.push(content) + parser.finish()
    return "".join(p.text for p in pieces if isinstance(p, TextPiece))


def case_id(case: ReasoningCase) -> str:
    return f"{case.parser}:{case.name}"


@pytest.mark.parametrize("case", REASONING_CASES, ids=case_id)
def test_reasoning_splits_a_whole_answer(case: ReasoningCase) -> None:
    reasoning, content = split(case, [case.text])
    assert (reasoning, answer_text(case, content)) == (case.reasoning, case.content)


@pytest.mark.parametrize("case", REASONING_CASES, ids=case_id)
def test_reasoning_streamed_in_any_chunking_splits_the_same(case: ReasoningCase) -> None:
    whole = split(case, [case.text])
    for chunks in chunkings(case.text):
        assert split(case, chunks) == whole, chunks


@pytest.mark.parametrize("name", ["deepseek_r1", "qwen3", "glm45", "kimi_k2"])
def test_reasoning_is_handed_on_as_it_comes(name: str) -> None:
    parser = REASONING_PARSERS[name]()
    assert parser.push("Let me think</th") == Split(reasoning="Let me think")
    assert parser.push("ink>Four") == Split(content="Four")


def test_reasoning_trailing_whitespace_waits_to_see_whether_more_reasoning_follows() -> None:
    parser = REASONING_PARSERS["glm45"]()
    assert parser.push("a \n") == Split(reasoning="a")
    assert parser.push("b</think>c \n") == Split(reasoning=" \nb", content="c \n")


def test_reasoning_of_gpt_oss_is_handed_on_as_it_comes() -> None:
    parser = REASONING_PARSERS["openai_gptoss"]()
    assert parser.push("<|channel|>analysis<|message|>Two and") == Split(reasoning="Two and")
    assert parser.push(" two.<|e") == Split(reasoning=" two.")
