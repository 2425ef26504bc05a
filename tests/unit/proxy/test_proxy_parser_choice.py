"""The served model's parsers: the settings, else its family (named, or known by its template),
else hermes calls and no reasoning."""

from __future__ import annotations

from pathlib import Path

import pytest

from farm.config import ProxySettings
from farm.errors import ConfigError
from farm.llm.families import FAMILIES, template_path
from farm.proxy.parsers import TEMPLATE_FAMILIES, ParserNames, choose, family_of, template_key


def test_every_family_s_published_template_is_known_as_that_family(families_dir: Path) -> None:
    for family in FAMILIES.values():
        template = template_path(families_dir, family).read_text(encoding="utf-8")
        assert family_of(ProxySettings(), template) == family.name
        assert family_of(ProxySettings(), f"\n{template}\n") == family.name  # surrounding whitespace aside
    assert sorted(TEMPLATE_FAMILIES.values()) == sorted(FAMILIES)


def test_a_family_chooses_its_parsers() -> None:
    chosen = {name: choose(ProxySettings(family=name), None) for name in ("qwen3", "llama3", "deepseek-r1")}
    assert chosen["qwen3"] == ParserNames(tool_calls="hermes", reasoning="qwen3")
    assert chosen["llama3"] == ParserNames(tool_calls="llama3_json", reasoning="none")
    # vLLM serves DeepSeek-R1 without a tool-call parser: hermes, as for any model; the built-in loop
    # renders its (llama.cpp) template with thinking on, as the published one prompts.
    assert chosen["deepseek-r1"] == ParserNames(
        tool_calls="hermes", reasoning="deepseek_r1", template_kwargs={"enable_thinking": True}
    )


def test_the_settings_name_the_parsers_over_the_family() -> None:
    settings = ProxySettings(family="qwen3", reasoning_parser="none")
    assert choose(settings, None) == ParserNames(tool_calls="hermes", reasoning="none")
    settings = ProxySettings(tool_parser="qwen3_coder", reasoning_parser="deepseek_r1")
    assert choose(settings, "{{ messages }}") == ParserNames(tool_calls="qwen3_coder", reasoning="deepseek_r1")


def test_a_model_of_no_known_family_writes_hermes_calls_and_no_reasoning() -> None:
    assert family_of(ProxySettings(), "{{ messages }}") is None
    assert family_of(ProxySettings(), None) is None
    assert choose(ProxySettings(), None) == ParserNames(tool_calls="hermes", reasoning="none")
    assert template_key(" x ") == template_key("x")


@pytest.mark.parametrize(
    ("settings", "words"),
    [
        (ProxySettings(family="qwen9"), "proxy.family 'qwen9' is not a family; known: qwen2.5"),
        (ProxySettings(tool_parser="pythonic"), "no tool-call parser 'pythonic'"),
        (ProxySettings(reasoning_parser="granite"), "no reasoning parser 'granite'"),
    ],
)
def test_a_name_that_does_not_exist_is_a_config_error(settings: ProxySettings, words: str) -> None:
    with pytest.raises(ConfigError, match=words):
        choose(settings, None)


@pytest.mark.parametrize("name", ["qwen3", "deepseek_r1", "glm45", "kimi_k2"])
@pytest.mark.parametrize(
    "tail", ["<|im_start|>assistant\n<think>\n\n</think>\n\n", "<｜Assistant｜><think>\n</think>"], ids=["qwen3", "r1"]
)
def test_a_prompt_that_closed_the_think_block_makes_the_answer_content(name: str, tail: str) -> None:
    from farm.proxy.parsers import reasoning_parser

    parser = reasoning_parser(name, prompt_tail=tail)
    split, last = parser.push("hello</think> there"), parser.finish()
    assert split.reasoning + last.reasoning == "" and split.content + last.content == "hello</think> there"
    # A prompt that leaves the block open (or never wrote one) reads reasoning first, as before.
    opened = reasoning_parser(name, prompt_tail="<|im_start|>assistant\n<think>\n")
    assert opened.push("plan</think>hello").reasoning.strip() == "plan"
