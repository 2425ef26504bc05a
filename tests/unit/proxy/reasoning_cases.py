"""Model outputs per reasoning format, with the split each must give."""

from __future__ import annotations

from tests.unit.proxy.parser_case_kit import ANALYSIS, HARMONY_CALL, KS_CLOSE, KS_OPEN, ReasoningCase, kimi

# ---------------------------------------------------------------- reasoning

HERMES_LIST_FILES = '<tool_call>\n{"name": "list_files", "arguments": {}}\n</tool_call>'
REASONING_CASES = [
    ReasoningCase(
        "deepseek_r1", "prompt opened the think", "Let me see.\n</think>\n\nIt is 4.", "Let me see.\n", "\n\nIt is 4."
    ),
    ReasoningCase("deepseek_r1", "model opens the think", "<think>Hmm.</think>Four.", "Hmm.", "Four."),
    ReasoningCase("deepseek_r1", "no end tag", "Still thinking when it stopped", "Still thinking when it stopped", ""),
    ReasoningCase("deepseek_r1", "empty reasoning", "</think>Four.", "", "Four."),
    ReasoningCase("deepseek_r1", "unicode", "Réfléchissons 🤔</think>答案是四", "Réfléchissons 🤔", "答案是四"),
    ReasoningCase("deepseek_r1", "second end tag is content", "a</think>b</think>c", "a", "b</think>c"),
    ReasoningCase(
        "deepseek_r1",
        "text before the think",
        "x<think>y</think>z",
        "xy",
        "z",
        vllm=("y", "z", "vLLM drops what comes before <think>; the farm has streamed it as reasoning already"),
    ),
    ReasoningCase("deepseek_r1", "nothing after the end tag", "<think>y</think>", "y", ""),
    ReasoningCase("qwen3", "text before the think", "x<think>y</think>z", "xy", "z"),
    ReasoningCase("qwen3", "only whitespace after", "y</think>\n\n", "y", "\n\n"),
    ReasoningCase("qwen3", "never closed", "<think>\nabc", "\nabc", ""),
    ReasoningCase(
        "openai_gptoss", "analysis never ended", "<|channel|>analysis<|message|>unfinished", "unfinished", ""
    ),
    ReasoningCase(
        "openai_gptoss",
        "final never ended",
        "<|channel|>analysis<|message|>t<|end|><|start|>assistant<|channel|>final<|message|>unfinished answer",
        "t",
        "unfinished answer",
    ),
    ReasoningCase(
        "qwen3", "thinking off", "<think>\n\n</think>\n\nFour.", "", "<think>\n\n</think>\n\nFour.", thinking=False
    ),
    ReasoningCase("glm45", "think tags", "<think>Hmm. \n</think>Four.", "Hmm.", "Four."),
    ReasoningCase("glm45", "no tags", "Just thinking \n", "Just thinking", ""),
    ReasoningCase("glm45", "thinks again", "<think>a</think>b<think>c \n</think>d</think>e", "ac", "bde"),
    ReasoningCase(
        "glm45",
        "tool call ends reasoning",
        "<think>Need files.\n<tool_call>list_files</tool_call>",
        "Need files.",
        "<tool_call>list_files</tool_call>",
    ),
    ReasoningCase("glm45", "thinking off", "<think>a</think>b", "", "<think>a</think>b", thinking=False),
    ReasoningCase("kimi_k2", "think tags", "<think>Hmm. </think>Four.", "Hmm.", "Four."),
    ReasoningCase("kimi_k2", "no tags", "Just thinking", "Just thinking", ""),
    ReasoningCase(
        "kimi_k2",
        "call section ends reasoning",
        "<think>Need files. " + KS_OPEN + kimi("functions.list_files:0", "{}") + KS_CLOSE,
        "Need files.",
        KS_OPEN + kimi("functions.list_files:0", "{}") + KS_CLOSE,
    ),
    ReasoningCase("kimi_k2", "second end tag dropped", "a</think>b</think>c", "a", "bc"),
    ReasoningCase("kimi_k2", "thinking off", "<think>a</think>b", "", "<think>a</think>b", thinking=False),
    ReasoningCase("openai_gptoss", "no harmony at all", "just plain text", "", ""),
    ReasoningCase(
        "openai_gptoss",
        "header never ended",
        "<|channel|>analysis<|message|>t<|end|><|start|>assistant<|channel|>fin",
        "t",
        "",
    ),
    ReasoningCase("qwen3", "think tags", "<think>\nHmm.\n</think>\n\nFour.", "\nHmm.\n", "\n\nFour."),
    ReasoningCase("qwen3", "prompt opened the think", "Hmm.</think>Four.", "Hmm.", "Four."),
    ReasoningCase("qwen3", "no tags", "Just an answer.", "Just an answer.", ""),
    ReasoningCase(
        "qwen3",
        "tool call after reasoning",
        "<think>Need files.</think>\n\n" + HERMES_LIST_FILES,
        "Need files.",
        "\n\n" + HERMES_LIST_FILES,
    ),
    ReasoningCase(
        "qwen3", "tool call ends reasoning", "<think>Need files." + HERMES_LIST_FILES, "Need files.", HERMES_LIST_FILES
    ),
    ReasoningCase("qwen3", "second end tag dropped", "a</think>b</think>c", "a", "bc"),
    ReasoningCase("qwen3", "unicode", "<think>Réfléchissons 🤔</think>答案", "Réfléchissons 🤔", "答案"),
    ReasoningCase(
        "openai_gptoss",
        "analysis then final",
        "<|channel|>analysis<|message|>Two and two.<|end|><|start|>assistant<|channel|>final<|message|>Four.<|return|>",
        "Two and two.",
        "Four.",
    ),
    ReasoningCase(
        "openai_gptoss",
        "two analysis messages",
        "<|channel|>analysis<|message|>One.<|end|><|start|>assistant<|channel|>analysis<|message|>Two.<|end|>"
        "<|start|>assistant<|channel|>final<|message|>Done ✓<|return|>",
        "One.\nTwo.",
        "Done ✓",
    ),
    ReasoningCase("openai_gptoss", "final only", "<|channel|>final<|message|>Four.<|return|>", "", "Four."),
    ReasoningCase("openai_gptoss", "analysis then call", ANALYSIS + HARMONY_CALL, "Need the weather.", ""),
]
