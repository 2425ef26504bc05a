"""Edges of each tool-call format: partial tags, open parameters, whitespace, cut-off sections, ..."""

from __future__ import annotations

from tests.unit.proxy.parser_case_kit import (
    ANALYSIS,
    DS_CLOSE,
    DS_OPEN,
    HARMONY_CALL,
    KS_CLOSE,
    KS_OPEN,
    TOOLS,
    ToolCase,
    ds,
    kimi,
    qc,
)

# ---------------------------------------------------------------- edges, each format

EDGES = [
    ToolCase(
        "qwen3_coder",
        "partial tags in prose",
        "a <tool b <function c [TOOL_CALLS] d <|x|> e",
        [],
        "a <tool b <function c [TOOL_CALLS] d <|x|> e",
    ),
    ToolCase("qwen3_coder", "no parameters", qc("list_files"), [("list_files", {})], "", TOOLS),
    ToolCase(
        "qwen3_coder",
        "parameter left open",
        "<tool_call>\n<function=get_weather>\n<parameter=city>\nA\n<parameter=days>\n2\n</parameter>\n</function>\n</tool_call>",
        [("get_weather", {"city": "A", "days": 2})],
        "",
        TOOLS,
    ),
    ToolCase(
        "qwen3_coder",
        "one newline each side is markup",
        qc("get_weather", city="\n  spaced  \n"),
        [("get_weather", {"city": "\n  spaced  \n"})],
        "",
        TOOLS,
    ),
    ToolCase(
        "glm45",
        "spaces kept in values",
        "<tool_call> get_weather \n<arg_key> city </arg_key>\n<arg_value> x y </arg_value>\n</tool_call>",
        [("get_weather", {"city": " x y "})],
        "",
        TOOLS,
    ),
    ToolCase(
        "llama3_json",
        "arguments not an object",
        '{"name": "get_weather", "parameters": "Tokyo"}',
        [],
        '{"name": "get_weather", "parameters": "Tokyo"}',
        vllm=([("get_weather", "Tokyo")], "vLLM passes arguments that are not an object on; the farm keeps them prose"),
    ),
    ToolCase(
        "llama3_json",
        "whitespace around",
        '  \n{"name": "list_files", "parameters": {}}\n',
        [("list_files", {})],
        "  \n\n",
    ),
    ToolCase(
        "kimi_k2",
        "newlines in the section",
        KS_OPEN + "\n" + kimi("functions.list_files:0", "{}") + "\n" + KS_CLOSE,
        [("list_files", {})],
        "",
        TOOLS,
    ),
    ToolCase(
        "kimi_k2", "unclosed section", KS_OPEN + kimi("functions.list_files:0", "{}"), [("list_files", {})], "", TOOLS
    ),
    ToolCase(
        "mistral",
        "v11 text after the call",
        "[TOOL_CALLS]list_files[ARGS]{} then text",
        [("list_files", {})],
        " then text",
        mistral_v11=True,
    ),
    ToolCase(
        "mistral",
        "list dialect, one object",
        '[TOOL_CALLS]{"name": "get_weather", "arguments": {"days": 1}}',
        [("get_weather", {"days": 1})],
        "",
    ),
    ToolCase(
        "deepseek_v31",
        "text after the section",
        DS_OPEN + ds("list_files", "{}") + DS_CLOSE + " after",
        [("list_files", {})],
        " after",
    ),
    ToolCase(
        "deepseek_v31",
        "arguments over several lines",
        DS_OPEN + ds("get_weather", '{\n  "city": "Tokyo"\n}') + DS_CLOSE,
        [("get_weather", {"city": "Tokyo"})],
        "",
        vllm=([], "vLLM bug: its regex lacks DOTALL, so a call whose JSON arguments span lines is dropped"),
    ),
    ToolCase(
        "qwen3_coder",
        "tool not offered",
        qc("launch_rocket", fuel="3"),
        [("launch_rocket", {"fuel": "3"})],
        "",
        TOOLS,
    ),
    ToolCase(
        "kimi_k2",
        "tool not offered",
        KS_OPEN + kimi("functions.launch_rocket:0", "{}") + KS_CLOSE,
        [("launch_rocket", {})],
        "",
        TOOLS,
    ),
    ToolCase(
        "mistral",
        "v11 tool not offered",
        "[TOOL_CALLS]launch_rocket[ARGS]{}",
        [("launch_rocket", {})],
        "",
        TOOLS,
        mistral_v11=True,
    ),
    ToolCase(
        "mistral",
        "v11 marker with no call",
        '[TOOL_CALLS] [TOOL_CALLS]list_files[ARGS]{"k": 1}',
        [("list_files", {"k": 1})],
        "[TOOL_CALLS] ",
        mistral_v11=True,
        vllm=([("[TOOL_CALLS]list_files", {"k": 1})], "vLLM reads the second marker into the call's name"),
    ),
    ToolCase(
        "mistral",
        "v11 call id",
        '[TOOL_CALLS]get_weather[CALL_ID]a1b2c3d4e[ARGS]{"city": "Tokyo"}',
        [("get_weather", {"city": "Tokyo"})],
        "",
        mistral_v11=True,
        vllm=(
            [("get_weathera1b2c3d4e", {"city": "Tokyo"})],
            "vLLM 0.32 (with a Hugging Face tokenizer) reads the [CALL_ID] id into the name",
        ),
    ),
    ToolCase(
        "openai",
        "call unclosed at the end",
        '<|channel|>commentary to=functions.get_weather <|constrain|>json<|message|>{"days": 2}',
        [("get_weather", {"days": 2})],
        "",
    ),
    ToolCase("openai", "no harmony at all", "just plain text", [], ""),
    ToolCase(
        "deepseek_v31",
        "unclosed section, second call cut off",
        DS_OPEN + ds("list_files", "{}") + "<｜tool▁call▁begin｜>run<｜tool▁sep｜>{",
        [("list_files", {})],
        "<｜tool▁call▁begin｜>run<｜tool▁sep｜>{",
    ),
    ToolCase(
        "kimi_k2",
        "unclosed section, second call cut off",
        KS_OPEN
        + kimi("functions.list_files:0", "{}")
        + "<|tool_call_begin|>functions.run:1<|tool_call_argument_begin|>{",
        [("list_files", {})],
        "<|tool_call_begin|>functions.run:1<|tool_call_argument_begin|>{",
        TOOLS,
        vllm=(
            [("list_files", {}), ("run", {"<unparsed>": "{"})],
            "vLLM credits a call the model never finished; the farm keeps it prose",
        ),
    ),
    ToolCase(
        "qwen3_coder",
        "unclosed tool_call, second function cut off",
        "<tool_call>\n<function=list_files>\n</function>\n<function=run>\n<parameter=x>\n1",
        [("list_files", {})],
        "\n<function=run>\n<parameter=x>\n1",
        TOOLS,
        vllm=(
            [("list_files", {}), ("run", {})],
            "vLLM credits a call the model never finished (without the open parameter); the farm keeps it prose",
        ),
    ),
    ToolCase("openai", "final never ended", "<|channel|>final<|message|>partial answer", [], "partial answer"),
    ToolCase(
        "openai",
        "two calls",
        ANALYSIS
        + HARMONY_CALL
        + "<|start|>assistant"
        + HARMONY_CALL.replace("get_weather", "list_files").replace('{"city": "Tokyo"}', "{}"),
        [("get_weather", {"city": "Tokyo"}), ("list_files", {})],
        "",
    ),
]
