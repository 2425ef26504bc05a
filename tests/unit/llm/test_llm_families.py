"""Real model families as fixtures: each tokenizer against llama.cpp's test vectors, the added tokens at
the real ids, the published chat templates, and a tiny random model the built-in backend serves.

Needs scripts/setup_families.sh's cache (skipped locally without it, a failure in CI). The first run
on a machine parses each GGUF vocabulary (~30 s each); later runs read the cached tokenizers.
"""

from __future__ import annotations

import json

import pytest

from farm.errors import FamiliesMissing
from farm.llm.builtin.tiny import make_tiny
from farm.llm.families import FAMILIES, get_family, tokenizer_test_vectors
from farm.llm.types import SamplingParams

# A parse of a cold cache takes ~30 s per vocabulary, inside the first test that needs it.
pytestmark = pytest.mark.timeout(300)

NAMES = sorted(FAMILIES)
TOLERANCE = 1e-4
TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "bash",
            "description": "run a shell command",
            "parameters": {"type": "object", "properties": {"cmd": {"type": "string"}}, "required": ["cmd"]},
        },
    }
]
CALL = {"id": "call_1", "type": "function", "function": {"name": "bash", "arguments": {"cmd": "ls"}}}
#: how each family's published template writes the call above.
RENDERED_CALL = {
    "qwen2.5": '<tool_call>\n{"name": "bash", "arguments": {"cmd": "ls"}}\n</tool_call>',
    "qwen3": '<tool_call>\n{"name": "bash", "arguments": {"cmd": "ls"}}\n</tool_call>',
    "qwen3-coder": "<tool_call>\n<function=bash>\n<parameter=cmd>\nls\n</parameter>\n</function>\n</tool_call>",
    "qwen3.5": "<tool_call>\n<function=bash>\n<parameter=cmd>\nls\n</parameter>\n</function>\n</tool_call>",
    "llama3": '{"name": "bash", "parameters": {"cmd": "ls"}}',
    "deepseek-r1": '<｜tool▁call▁begin｜>function<｜tool▁sep｜>bash\n```json\n{"cmd": "ls"}\n```<｜tool▁call▁end｜>',
}
#: families whose template keeps the last assistant turn's reasoning.
THINKING = ["qwen3", "qwen3.5"]


@pytest.mark.parametrize("name", NAMES)
def test_family_tokenizer_matches_llama_cpp_test_vectors(name, families_dir, family_model_dir, family_tokenizer):
    from tokenizers import Tokenizer

    vectors = tokenizer_test_vectors(families_dir, get_family(name))
    assert len(vectors) >= 40
    loaded = family_tokenizer(name)
    # The tokenizer.json as written, as any other loader (vLLM's transformers, the tokenizers crate) reads it.
    raw = Tokenizer.from_file(str(family_model_dir(name) / "tokenizer.json"))
    wrong = [
        text
        for text, ids in vectors
        if loaded.encode(text, add_special_tokens=False) != ids or raw.encode(text, add_special_tokens=False).ids != ids
    ]
    assert wrong == []


@pytest.mark.parametrize("name", NAMES)
def test_family_added_tokens_sit_at_their_ids(name, family_tokenizer):
    family = get_family(name)
    tokenizer = family_tokenizer(name)
    assert len(tokenizer) == family.vocab_size
    for token in family.added_tokens:
        assert tokenizer.convert_tokens_to_ids(token.content) == token.id, token
        assert tokenizer.encode(f"a{token.content}b", add_special_tokens=False)[1:-1] == [token.id], token
        assert tokenizer.decode([token.id]) == token.content
    assert tokenizer.eos_token == family.eos_token
    assert tokenizer.pad_token == family.pad_token
    if family.add_bos:
        assert tokenizer("hi").input_ids[0] == tokenizer.convert_tokens_to_ids(family.bos_token)


@pytest.mark.parametrize("name", [n for n in NAMES if n in RENDERED_CALL])
def test_family_chat_template_renders_a_multi_turn_tool_conversation(name, family_tokenizer):
    tokenizer = family_tokenizer(name)
    messages = [
        {"role": "system", "content": "You are terse."},
        {"role": "user", "content": "list files"},
        {"role": "assistant", "content": "", "tool_calls": [CALL]},
        {"role": "tool", "tool_call_id": "call_1", "content": "a.py"},
        {"role": "assistant", "content": "There is a.py."},
        {"role": "user", "content": "thanks"},
    ]
    text = tokenizer.apply_chat_template(messages, tools=TOOLS, tokenize=False, add_generation_prompt=True)
    assert RENDERED_CALL[name] in text
    assert text.count("a.py") == 2 and "thanks" in text and "There is a.py." in text
    ids = tokenizer.apply_chat_template(messages, tools=TOOLS, add_generation_prompt=True, return_dict=False)
    # The markers are single ids in the rendered prompt, as the real model reads them.
    assert tokenizer.convert_tokens_to_ids(get_family(name).eos_token) in ids or name == "llama3"
    if "<tool_call>" in RENDERED_CALL[name]:
        assert tokenizer.convert_tokens_to_ids("<tool_call>") in ids


def test_phi3_chat_template_renders_turns(family_tokenizer):
    tokenizer = family_tokenizer("phi-3")
    messages = [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "hello"}]
    text = tokenizer.apply_chat_template(messages + [{"role": "user", "content": "bye"}], tokenize=False)
    assert text == "<|user|>\nhi<|end|>\n<|assistant|>\nhello<|end|>\n<|user|>\nbye<|end|>\n<|endoftext|>"


@pytest.mark.parametrize("name", THINKING)
def test_family_template_keeps_the_last_turns_reasoning(name, family_tokenizer):
    reply = {"role": "assistant", "content": "<think>\nplan\n</think>\n\nhello"}
    text = family_tokenizer(name).apply_chat_template([{"role": "user", "content": "hi"}, reply], tokenize=False)
    assert text.endswith("<|im_start|>assistant\n<think>\nplan\n</think>\n\nhello<|im_end|>\n")


def test_qwen3_template_drops_reasoning_once_a_user_turn_follows(family_tokenizer):
    # The fact issue 28's continuity work rests on: the same reply renders without its reasoning.
    messages = [
        {"role": "user", "content": "hi"},
        {"role": "assistant", "content": "<think>\nplan\n</think>\n\nhello"},
        {"role": "user", "content": "again"},
    ]
    text = family_tokenizer("qwen3").apply_chat_template(messages, tokenize=False)
    assert "<|im_start|>assistant\nhello<|im_end|>\n<|im_start|>user\nagain<|im_end|>\n" in text
    assert "plan" not in text


def test_deepseek_r1_generation_prompt_opens_its_reasoning(family_tokenizer):
    tokenizer = family_tokenizer("deepseek-r1")
    prompt = [{"role": "user", "content": "hi"}]
    text = tokenizer.apply_chat_template(prompt, tokenize=False, add_generation_prompt=True, enable_thinking=True)
    assert text == "<｜begin▁of▁sentence｜><｜User｜>hi<｜Assistant｜><think>\n"
    # llama.cpp's copy of the template closes the block unless asked to think (the published one never does).
    closed = tokenizer.apply_chat_template(prompt, tokenize=False, add_generation_prompt=True)
    assert closed.endswith("<｜Assistant｜><think>\n</think>")


@pytest.mark.parametrize("name", NAMES)
def test_family_tiny_model_is_the_real_architecture_and_small(name, family_model_dir):
    config = json.loads((family_model_dir(name) / "config.json").read_text())
    assert config["architectures"] == [get_family(name).architecture]
    assert config["tie_word_embeddings"] is True
    assert config["vocab_size"] == get_family(name).vocab_size
    assert (family_model_dir(name) / "model.safetensors").stat().st_size < 80_000_000


@pytest.mark.parametrize("name", NAMES)
def test_builtin_engine_generates_with_each_family(name, family_model_dir, family_tokenizer):
    from farm.llm.builtin.engine import Engine
    from tests.conftest import teacher_for

    model_dir = family_model_dir(name)
    prompt = family_tokenizer(name).apply_chat_template(
        [{"role": "user", "content": "hello"}], add_generation_prompt=True, return_dict=False
    )
    engine = Engine(model_dir=model_dir)
    engine.start()
    try:
        out = engine.submit(prompt, SamplingParams(max_tokens=5, seed=0)).result(timeout=120)
    finally:
        engine.stop()
    assert 1 <= len(out.token_ids) <= 5
    # The engine's own forward pass (per-sequence KV) agrees with a plain transformers forward pass.
    want = teacher_for(model_dir)(prompt + out.token_ids)[len(prompt) :]
    assert max(abs(a - b) for a, b in zip(out.logprobs, want, strict=True)) <= TOLERANCE


def test_unknown_family_names_the_known_ones():
    with pytest.raises(KeyError, match="qwen3.*llama3"):
        get_family("qwen9")


def test_make_tiny_family_without_the_cache_says_how_to_set_it_up(tmp_path):
    with pytest.raises(FamiliesMissing, match="scripts/setup_families.sh"):
        make_tiny(tmp_path / "m", family="qwen3", families_dir=tmp_path / "no-cache")


@pytest.mark.parametrize("name", ["qwen3", "deepseek-r1"])
def test_qwen2_vocabulary_tokenizer_json_normalizes_to_nfc(name, family_model_dir):
    # As Qwen's published tokenizer.json: a loader that reads the file as written (not transformers'
    # Qwen2Tokenizer, which adds NFC itself) sees "e" + U+0301 as "é". Qwen3.5's vectors pin the opposite.
    from tokenizers import Tokenizer

    raw = Tokenizer.from_file(str(family_model_dir(name) / "tokenizer.json"))
    assert raw.encode("re\u0301sume\u0301").ids == raw.encode("résumé").ids


def test_families_cli_make_tiny_writes_the_familys_model(families_dir, tmp_path):
    from click.testing import CliRunner

    from farm.llm.builtin.cli import llm

    out = tmp_path / "qwen3"
    done = CliRunner().invoke(llm, ["make-tiny", "--family", "qwen3", "--families-dir", str(families_dir), str(out)])
    assert done.exit_code == 0, done.output
    assert json.loads((out / "config.json").read_text())["architectures"] == ["Qwen3ForCausalLM"]
    missing = CliRunner().invoke(llm, ["make-tiny", "--family", "qwen3", "--families-dir", str(tmp_path / "none"), "x"])
    assert missing.exit_code == 1 and "scripts/setup_families.sh" in missing.output
