"""Scripted replies: rule order, turn index, forced ids, script validation, and texts that must round-trip."""

from __future__ import annotations

import json
from typing import Any

import pytest

from farm.errors import ConfigError
from farm.llm.builtin.script import Script, ScriptFile, load_script, turn_index
from farm.llm.builtin.tiny import EOS_TOKEN

RULES = {
    "rules": [
        {"match": r"two plus two", "turns": ["four", "still four", "four, again"]},
        {"match": r"plus", "turns": ["a sum"]},
        {"match": r"(?s)<\|im_start\|>system\n.*strict", "turns": ["yes"]},
    ]
}


def chat(tokenizer, *messages: tuple[str, str]) -> str:
    msgs = [{"role": role, "content": content} for role, content in messages]
    return tokenizer.apply_chat_template(msgs, tokenize=False, add_generation_prompt=True)


@pytest.fixture
def script(tiny_tokenizer) -> Script:
    return Script.for_model(load_script(RULES), tiny_tokenizer, stop_ids=frozenset({tiny_tokenizer.eos_token_id}))


def test_script_first_matching_rule_wins(script, tiny_tokenizer):
    assert script.match(chat(tiny_tokenizer, ("user", "what is two plus two?"))).text == "four"
    assert script.match(chat(tiny_tokenizer, ("user", "one plus one"))).text == "a sum"


def test_script_regex_sees_special_tokens_and_roles(script, tiny_tokenizer):
    prompt = chat(tiny_tokenizer, ("system", "be strict"), ("user", "hello"))
    assert script.match(prompt).rule == 2
    assert script.match(chat(tiny_tokenizer, ("user", "be strict"))) is None, "the rule asks for a system message"


def test_script_no_matching_rule_samples(script, tiny_tokenizer):
    assert script.match(chat(tiny_tokenizer, ("user", "hello"))) is None


def test_turn_index_counts_the_assistant_turns_before_the_generation_prompt(tiny_tokenizer):
    history = [("user", "two plus two")]
    for turn in range(3):
        assert turn_index(chat(tiny_tokenizer, *history)) == turn
        history += [("assistant", f"reply {turn}"), ("user", "and now?")]


def test_turn_index_without_a_generation_prompt_counts_every_closed_turn(tiny_tokenizer):
    msgs = [{"role": "user", "content": "q"}, {"role": "assistant", "content": "a"}]
    text = tiny_tokenizer.apply_chat_template(msgs, tokenize=False, add_generation_prompt=False)
    assert turn_index(text) == 1
    assert turn_index("plain text, no template") == 0


def test_script_turn_past_the_end_reuses_the_last_text(script, tiny_tokenizer):
    history = [("user", "two plus two")]
    texts = []
    for turn in range(5):
        texts.append(script.match(chat(tiny_tokenizer, *history)).text)
        history += [("assistant", f"reply {turn}"), ("user", "again")]
    assert texts == ["four", "still four", "four, again", "four, again", "four, again"]


def test_script_reply_ids_are_the_encoded_text_then_the_end_of_turn_id(script, tiny_tokenizer):
    prompt_ids = tiny_tokenizer.encode(chat(tiny_tokenizer, ("user", "two plus two")), add_special_tokens=False)
    reply = script.reply(prompt_ids)
    end = tiny_tokenizer.convert_tokens_to_ids(EOS_TOKEN)
    assert reply.token_ids == [*tiny_tokenizer.encode("four", add_special_tokens=False), end]
    assert (reply.rule, reply.turn) == (0, 0)


def test_script_hits_are_counted_per_rule_when_served(script, tiny_tokenizer):
    prompt_ids = tiny_tokenizer.encode(chat(tiny_tokenizer, ("user", "one plus one")), add_special_tokens=False)
    reply = script.reply(prompt_ids)
    assert [r["hits"] for r in script.report()] == [0, 0, 0], "matching alone is not a hit"
    script.hit(reply)
    assert script.report()[1] == {"match": "plus", "turns": 1, "hits": 1}


def test_script_for_model_needs_the_end_of_turn_to_be_a_stop_id(tiny_tokenizer):
    with pytest.raises(ConfigError, match="im_end"):
        Script.for_model(load_script(RULES), tiny_tokenizer, stop_ids=frozenset({0}))


def test_load_script_reads_a_file(tmp_path):
    path = tmp_path / "script.json"
    path.write_text(json.dumps(RULES))
    assert load_script(path) == ScriptFile.model_validate(RULES)


@pytest.mark.parametrize(
    ("content", "message"),
    [
        ("not json", "not JSON"),
        (json.dumps({"rules": [{"match": "(", "turns": ["x"]}]}), "regular expression"),
        (json.dumps({"rules": [{"match": "x", "turns": []}]}), "turns"),
        (json.dumps({"rules": [{"match": "x", "turns": ["y"], "turn": 1}]}), "turn"),
        (json.dumps([]), "valid script"),
    ],
)
def test_load_script_rejects_what_is_not_a_script(tmp_path, content, message):
    path = tmp_path / "script.json"
    path.write_text(content)
    with pytest.raises(ConfigError, match=message):
        load_script(path)


def test_load_script_missing_file_is_a_config_error(tmp_path):
    with pytest.raises(ConfigError, match="cannot read"):
        load_script(tmp_path / "nope.json")


ROUND_TRIP = [
    "The answer is 4.",
    "def add(a, b):\n    return a + b\n\n\nprint(add(2, 3))\n",
    '{"name": "bash", "arguments": {"cmd": "ls -la \\"my dir\\""}, "list": [1, 2.5, null], "empty": {}}\n',
    r"So $\frac{3}{4}$, i.e. \boxed{3/4}.",
    '<tool_call>\n{"name": "bash", "arguments": {"cmd": "pytest -q"}}\n</tool_call>',
    "I will call a tool.<tool_call>\n{}\n</tool_call>",
    "  leading and trailing spaces, tabs\tand\r\nCRLF  \n\n",
    "Unicode: naïve café, em dash —, emoji 😀, CJK 漢字",
    "",
]


@pytest.mark.parametrize("text", ROUND_TRIP)
def test_script_texts_round_trip_through_the_tiny_tokenizer(tiny_tokenizer, text):
    ids = tiny_tokenizer.encode(text, add_special_tokens=False)
    assert tiny_tokenizer.decode(ids, skip_special_tokens=False) == text


def test_tool_call_markers_are_single_special_ids(tiny_tokenizer):
    ids = tiny_tokenizer.encode("<tool_call>x</tool_call>", add_special_tokens=False)
    assert ids[0] == tiny_tokenizer.convert_tokens_to_ids("<tool_call>")
    assert ids[-1] == tiny_tokenizer.convert_tokens_to_ids("</tool_call>")
    # Decoded with skip_special_tokens=True the markers vanish: scripted tool calls need False.
    assert tiny_tokenizer.decode(ids, skip_special_tokens=True) == "x"


@pytest.mark.parametrize(
    ("family", "opening", "end"),
    [
        ("qwen3", "<|im_start|>assistant", "<|im_end|>"),
        ("llama3", "<|start_header_id|>assistant<|end_header_id|>", "<|eot_id|>"),
        ("deepseek-r1", "<｜Assistant｜>", "<｜end▁of▁sentence｜>"),
        ("phi-3", "<|assistant|>", "<|end|>"),
    ],
)
def test_template_markers_are_read_from_the_family_s_template(family_model_dir, family, opening, end):
    from transformers import AutoTokenizer, GenerationConfig

    from farm.llm.builtin.script import template_markers

    model_dir = family_model_dir(family)
    tokenizer: Any = AutoTokenizer.from_pretrained(model_dir)
    eos = GenerationConfig.from_pretrained(model_dir).eos_token_id
    stop_ids = frozenset(eos if isinstance(eos, list) else [eos])
    assert template_markers(tokenizer, stop_ids) == (opening, end, tokenizer.convert_tokens_to_ids(end))
    script = Script.for_model(load_script(RULES), tokenizer, stop_ids=stop_ids)
    assert (script.opening, script.end) == (opening, end) if family != "qwen3" else script.end == end
    # No end-of-turn id the engine stops at: refused, naming the ids.
    with pytest.raises(ConfigError, match="stops at"):
        Script.for_model(load_script(RULES), tokenizer, stop_ids=frozenset({0}))
