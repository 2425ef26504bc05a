"""Sampled model outputs: well-formed answers drawn at random per tool-call format, with their truth.

Each sample is rendered from calls drawn at random (names, nested arguments with quotes, escapes,
braces, newlines and unicode; one to three calls; prose before and after where the format has
prose), so what a parser must find is known exactly. Seeded: the same samples every run.
"""

from __future__ import annotations

import json
import random
from typing import Any

from tests.unit.proxy.parser_case_kit import DS_CLOSE, DS_OPEN, KS_CLOSE, KS_OPEN, ToolCase

SAMPLES_PER_FORMAT = 40
#: a rendered answer: text, its prose, Mistral's v11 dialect?, and vLLM's calls where it reads them otherwise.
Rendered = tuple[str, str, bool, list | None]
_WORDS = ["the", "weather", "Ça", "東京", "🌸", "x", "is", "42", "ok?", "naïve", "∑", "tab\there", "new\nline"]
_TRICKY = ['"quoted"', "back\\slash", "}", "]", "{", "[", "</b>", "a, b", "é", "\n", "\u2028", "<", ">"]


def _text(rng: random.Random, words: int) -> str:
    return " ".join(rng.choice(_WORDS) for _ in range(words))


def _string(rng: random.Random) -> str:
    return "".join(rng.choice(_WORDS + _TRICKY) for _ in range(rng.randint(1, 6)))


def _value(rng: random.Random, depth: int) -> Any:
    kind = rng.choice(["str", "int", "float", "bool", "null", "list", "dict"] if depth < 3 else ["str", "int"])
    if kind == "str":
        return _string(rng)
    if kind == "int":
        return rng.randint(-1000, 10**6)
    if kind == "float":
        return rng.choice([0.5, -2.25, 3.125e-5, 1e21])
    if kind == "bool":
        return rng.random() < 0.5
    if kind == "null":
        return None
    if kind == "list":
        return [_value(rng, depth + 1) for _ in range(rng.randint(0, 3))]
    return _object(rng, depth + 1)


def _object(rng: random.Random, depth: int = 0) -> dict[str, Any]:
    return {
        f"{rng.choice(['k', 'arg', 'ключ', 'name', 'x_y'])}{i}": _value(rng, depth) for i in range(rng.randint(0, 3))
    }


def _name(rng: random.Random) -> str:
    return rng.choice(["get_weather", "list_files", "run", "search_web", "f2", "edit_file"])


def _texts(rng: random.Random) -> dict[str, str]:
    """Arguments whose values are text (formats that write values as text keep them strings)."""
    return {
        f"p{i}": rng.choice([_text(rng, rng.randint(1, 4)), "line one\nline two", "  padded  ", "{not json"])
        for i in range(rng.randint(0, 3))
    }


def _dumps(value: Any, rng: random.Random) -> str:
    return json.dumps(value, ensure_ascii=rng.random() < 0.3, indent=rng.choice([None, None, 2]))


def sample(parser: str, index: int) -> ToolCase:
    """The ``index``-th sample of ``parser``'s format."""
    rng = random.Random(f"{parser}:{index}")
    text_values = parser in ("qwen3_coder", "glm45")
    calls = [(_name(rng), _texts(rng) if text_values else _object(rng)) for _ in range(rng.randint(1, 3))]
    before = _text(rng, rng.randint(0, 5)) if rng.random() < 0.6 else ""
    text, prose, v11, vllm_calls = _RENDER[parser](rng, calls, before)
    vllm = None
    if vllm_calls is not None and vllm_calls != calls:
        vllm = (vllm_calls, "vLLM drops a DeepSeek V3.1 call whose JSON arguments span lines (its regex lacks DOTALL)")
    return ToolCase(parser, f"sample {index}", text, [(n, a) for n, a in calls], prose, mistral_v11=v11, vllm=vllm)


def _hermes(rng: random.Random, calls: list, before: str) -> Rendered:
    blocks = [f'<tool_call>\n{{"name": "{n}", "arguments": {_dumps(a, rng)}}}\n</tool_call>' for n, a in calls]
    return before + "\n".join(blocks), before + "\n" * (len(blocks) - 1), False, None


def _qwen3_coder(rng: random.Random, calls: list, before: str) -> Rendered:
    blocks = []
    for name, args in calls:
        body = "".join(f"<parameter={k}>\n{v}\n</parameter>\n" for k, v in args.items())
        blocks.append(f"<tool_call>\n<function={name}>\n{body}</function>\n</tool_call>")
    return before + "\n".join(blocks), before + "\n" * (len(blocks) - 1), False, None


def _glm45(rng: random.Random, calls: list, before: str) -> Rendered:
    sep = rng.choice(["\n", ""])
    blocks = []
    for name, args in calls:
        body = "".join(f"<arg_key>{k}</arg_key>{sep}<arg_value>{v}</arg_value>{sep}" for k, v in args.items())
        blocks.append(f"<tool_call>{name}{sep}{body}</tool_call>")
    return before + sep.join(blocks), before + sep * (len(blocks) - 1), False, None


def _llama3_json(rng: random.Random, calls: list, before: str) -> Rendered:
    key = rng.choice(["parameters", "arguments"])
    objects = [f'{{"name": "{n}", "{key}": {_dumps(a, rng)}}}' for n, a in calls]
    tag = "<|python_tag|>" if rng.random() < 0.3 else ""
    return before + tag + "; ".join(objects), before, False, None


def _deepseek_v31(rng: random.Random, calls: list, before: str) -> Rendered:
    body, one_line = "", []
    for name, args in calls:
        written = _dumps(args, rng)
        body += f"<｜tool▁call▁begin｜>{name}<｜tool▁sep｜>{written}<｜tool▁call▁end｜>"
        if "\n" not in written:
            one_line.append((name, args))
    return before + DS_OPEN + body + DS_CLOSE, before, False, one_line


def _kimi_k2(rng: random.Random, calls: list, before: str) -> Rendered:
    body = "".join(
        f"<|tool_call_begin|>functions.{n}:{i}<|tool_call_argument_begin|>{_dumps(a, rng)}<|tool_call_end|>"
        for i, (n, a) in enumerate(calls)
    )
    return before + KS_OPEN + body + KS_CLOSE, before, False, None


def _mistral(rng: random.Random, calls: list, before: str) -> Rendered:
    if rng.random() < 0.5:
        listed = ", ".join(f'{{"name": "{n}", "arguments": {_dumps(a, rng)}}}' for n, a in calls)
        return f"{before}[TOOL_CALLS][{listed}]", before, False, None
    return before + "".join(f"[TOOL_CALLS]{n}[ARGS]{_dumps(a, rng)}" for n, a in calls), before, True, None


def _openai(rng: random.Random, calls: list, before: str) -> Rendered:
    parts = [f"<|channel|>analysis<|message|>{_text(rng, 4)}<|end|>"]
    if before:
        parts.append(f"<|start|>assistant<|channel|>commentary<|message|>{before}<|end|>")
    for name, args in calls:
        if rng.random() < 0.5:
            header = f"<|channel|>commentary to=functions.{name} <|constrain|>json"
        else:
            header = f" to=functions.{name}<|channel|>commentary json"
        parts.append(f"<|start|>assistant{header}<|message|>{_dumps(args, rng)}<|call|>")
    return "".join(parts).removeprefix("<|start|>assistant"), before, False, None


_RENDER = {
    "hermes": _hermes,
    "qwen3_coder": _qwen3_coder,
    "glm45": _glm45,
    "llama3_json": _llama3_json,
    "deepseek_v31": _deepseek_v31,
    "kimi_k2": _kimi_k2,
    "mistral": _mistral,
    "openai": _openai,
}
SAMPLES = [sample(parser, i) for parser in _RENDER for i in range(SAMPLES_PER_FORMAT)]
