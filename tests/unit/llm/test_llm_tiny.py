"""The tiny model: deterministic per seed, a tokenizer that round-trips, ChatML with tool-call tokens."""

from __future__ import annotations

import hashlib

from farm.llm.builtin.tiny import SPECIAL_TOKENS, make_tiny


def digest(path):
    return hashlib.sha256(path.read_bytes()).hexdigest()


def test_make_tiny_same_seed_same_files(tmp_path, tiny_model_dir):
    again = make_tiny(tmp_path / "again", seed=0)
    for name in ("model.safetensors", "tokenizer.json", "config.json"):
        assert digest(again / name) == digest(tiny_model_dir / name)


def test_make_tiny_other_seed_other_weights(tmp_path, tiny_model_dir):
    other = make_tiny(tmp_path / "other", seed=1)
    assert digest(other / "model.safetensors") != digest(tiny_model_dir / "model.safetensors")
    assert digest(other / "tokenizer.json") == digest(tiny_model_dir / "tokenizer.json")


def test_tiny_model_is_a_small_llama_with_head_dim_64(tiny_model_dir):
    from transformers import AutoConfig, AutoModelForCausalLM

    config = AutoConfig.from_pretrained(tiny_model_dir)
    assert config.model_type == "llama"
    assert config.head_dim == 64
    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir)
    assert 100_000 < sum(p.numel() for p in model.parameters()) < 1_000_000


def test_tiny_tokenizer_special_tokens_are_single_ids(tiny_tokenizer):
    for token in SPECIAL_TOKENS:
        ids = tiny_tokenizer.encode(token, add_special_tokens=False)
        assert ids == [tiny_tokenizer.convert_tokens_to_ids(token)]


def test_tiny_tokenizer_round_trips_text(tiny_tokenizer):
    text = "def f(x):\n    return x * 2  # ünïcode ok\n"
    assert tiny_tokenizer.decode(tiny_tokenizer.encode(text, add_special_tokens=False)) == text


CALL_ARGS = {"cmd": "ls"}


def test_tiny_chat_template_renders_tool_calls_and_responses(tiny_tokenizer):
    messages = [
        {"role": "user", "content": "list files"},
        {"role": "assistant", "content": "", "tool_calls": [{"function": {"name": "bash", "arguments": CALL_ARGS}}]},
        {"role": "tool", "content": "a.py"},
    ]
    text = tiny_tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    assert '<tool_call>\n{"name": "bash", "arguments": {"cmd": "ls"}}\n</tool_call><|im_end|>' in text
    assert "<|im_start|>tool\n<tool_response>\na.py\n</tool_response><|im_end|>\n" in text
    assert text.endswith("<|im_start|>assistant\n")
    ids = tiny_tokenizer.apply_chat_template(messages, tokenize=True, add_generation_prompt=True, return_dict=False)
    assert ids == tiny_tokenizer.encode(text, add_special_tokens=False)
