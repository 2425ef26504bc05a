"""Run inside vLLM's virtual environment: feed model outputs to vLLM's own parsers, print what they find.

Reads ``{"tokenizer_dir": ..., "cases": [...]}`` as JSON on stdin; each case is ``{"kind": "tool" |
"reasoning", "parser": NAME, "text": ..., "tools": [...] | null}`` (tool cases may say
``"mistral_v11": true``, reasoning cases ``"thinking": false``). Writes one JSON list: per case
``{"calls": [{"name", "arguments"}]}`` (arguments parsed as JSON where they are JSON) or
``{"reasoning", "content"}``, or ``{"error": ...}``. Used by ``test_parsers_vllm_agreement.py``; it
imports nothing from the farm (vLLM's environment does not have it).
"""

from __future__ import annotations

import json
import logging
import sys

#: every format's special tokens, so vLLM's parsers find them in the vocabulary.
SPECIAL_TOKENS = [
    "<think>",
    "</think>",
    "<tool_call>",
    "</tool_call>",
    "<arg_key>",
    "</arg_key>",
    "<arg_value>",
    "</arg_value>",
    "<|python_tag|>",
    "<|eom_id|>",
    "<|eot_id|>",
    "<｜tool▁calls▁begin｜>",
    "<｜tool▁calls▁end｜>",
    "<｜tool▁call▁begin｜>",
    "<｜tool▁call▁end｜>",
    "<｜tool▁sep｜>",
    "<|tool_calls_section_begin|>",
    "<|tool_calls_section_end|>",
    "<|tool_call_begin|>",
    "<|tool_call_end|>",
    "<|tool_call_argument_begin|>",
    "[TOOL_CALLS]",
]
#: Mistral's v11+ tokenizers have ``[ARGS]``; its parser picks the dialect by the vocabulary.
MISTRAL_V11_TOKENS = ["[ARGS]", "[CALL_ID]"]


def _tokenizer(path: str, extra: list[str]) -> object:
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(path)
    tokenizer.add_special_tokens({"additional_special_tokens": SPECIAL_TOKENS + extra})
    return tokenizer


def _arguments(text: str) -> object:
    try:
        return json.loads(text)
    except ValueError:
        return {"<unparsed>": text}


def _request(tools: list[dict] | None) -> object:
    from vllm.entrypoints.openai.chat_completion.protocol import ChatCompletionRequest

    return ChatCompletionRequest(model="m", messages=[{"role": "user", "content": "hi"}], tools=tools or None)


def _tool_case(case: dict, tokenizers: dict[str, object]) -> dict:
    from vllm.tool_parsers import ToolParserManager

    if case["parser"] == "openai":
        return _harmony_case(case, tokenizers["plain"])
    tokenizer = tokenizers["mistral_v11" if case.get("mistral_v11") else "plain"]
    parser = ToolParserManager.get_tool_parser(case["parser"])(tokenizer, case.get("tools"))
    info = parser.extract_tool_calls(case["text"], _request(case.get("tools")))
    calls = [{"name": c.function.name, "arguments": _arguments(c.function.arguments)} for c in info.tool_calls]
    return {"calls": calls if info.tools_called else []}


def _harmony_case(case: dict, tokenizer: object) -> dict:
    from openai_harmony import HarmonyEncodingName, load_harmony_encoding
    from vllm.parser.parser_manager import ParserManager

    encoding = load_harmony_encoding(HarmonyEncodingName.HARMONY_GPT_OSS)
    ids = encoding.encode(case["text"], allowed_special="all")
    parser_cls = ParserManager.get_parser(
        tool_parser_name="openai", reasoning_parser_name="openai_gptoss", enable_auto_tools=True, is_harmony=True
    )
    parser = parser_cls(tokenizer, case.get("tools"))
    reasoning, content, calls = parser.parse(case["text"], _request(case.get("tools")), True, ids)
    out = [{"name": c.name, "arguments": _arguments(c.arguments)} for c in calls or []]
    if case["kind"] == "reasoning":
        return {"reasoning": reasoning or "", "content": content or ""}
    return {"calls": out}


def _reasoning_case(case: dict, tokenizers: dict[str, object]) -> dict:
    from vllm.reasoning import ReasoningParserManager

    if case["parser"] == "openai_gptoss":
        return _harmony_case(case, tokenizers["plain"])
    switch = {} if case.get("thinking", True) else {"enable_thinking": False, "thinking": False}
    make = ReasoningParserManager.get_reasoning_parser(case["parser"])
    parser = make(tokenizers["plain"], chat_template_kwargs=switch) if switch else make(tokenizers["plain"])
    reasoning, content = parser.extract_reasoning(case["text"], _request(None))
    return {"reasoning": reasoning or "", "content": content or ""}


def main() -> None:
    logging.disable(logging.CRITICAL)
    job = json.load(sys.stdin)
    tokenizers = {
        "plain": _tokenizer(job["tokenizer_dir"], []),
        "mistral_v11": _tokenizer(job["tokenizer_dir"], MISTRAL_V11_TOKENS),
    }
    results = []
    for case in job["cases"]:
        try:
            run = _tool_case if case["kind"] == "tool" else _reasoning_case
            results.append(run(case, tokenizers))
        except Exception as exc:  # noqa: BLE001 - a parser that raises is a result to report
            results.append({"error": f"{type(exc).__name__}: {exc}"})
    json.dump(results, sys.stdout)


if __name__ == "__main__":
    main()
