"""Model outputs per tool-call format (see ``parser_case_kit`` for what a case says)."""

from __future__ import annotations

from tests.unit.proxy.parser_case_kit import (
    ANALYSIS,
    DS_CLOSE,
    DS_OPEN,
    HARMONY_CALL,
    HERMES_CALL,
    KS_CLOSE,
    KS_OPEN,
    LLAMA_CALL,
    NESTED,
    TOOLS,
    UNICODE_CITY,
    ToolCase,
    ds,
    glm,
    kimi,
    qc,
)
from tests.unit.proxy.parser_edge_cases import EDGES

# ---------------------------------------------------------------- qwen3_coder


QWEN3_CODER = [
    ToolCase(
        "qwen3_coder",
        "single typed",
        qc("get_weather", city="Tokyo", days="3"),
        [("get_weather", {"city": "Tokyo", "days": 3})],
        "",
        TOOLS,
    ),
    ToolCase(
        "qwen3_coder",
        "single untyped",
        qc("get_weather", city="Tokyo", days="3"),
        [("get_weather", {"city": "Tokyo", "days": "3"})],
        "",
    ),
    ToolCase(
        "qwen3_coder",
        "parallel",
        qc("get_weather", city="Paris") + "\n" + qc("list_files"),
        [("get_weather", {"city": "Paris"}), ("list_files", {})],
        "\n",
        TOOLS,
    ),
    ToolCase(
        "qwen3_coder",
        "prose around",
        "Let me check.\n" + qc("get_weather", city="Oslo", metric="true") + "\nDone.",
        [("get_weather", {"city": "Oslo", "metric": True})],
        "Let me check.\n\nDone.",
        TOOLS,
    ),
    ToolCase(
        "qwen3_coder",
        "nested json",
        qc("get_weather", filter='{"a": [1, {"b": null, "c": "x}y"}], "d": {"e": true}}', hours="[1, 2]", ratio="null"),
        [("get_weather", {"filter": NESTED, "hours": [1, 2], "ratio": None})],
        "",
        TOOLS,
    ),
    ToolCase(
        "qwen3_coder",
        "unicode",
        "Ça va? " + qc("get_weather", city=UNICODE_CITY),
        [("get_weather", {"city": UNICODE_CITY})],
        "Ça va? ",
        TOOLS,
    ),
    ToolCase(
        "qwen3_coder",
        "multiline value",
        qc("get_weather", city="def f():\n    return '<b>'\n"),
        [("get_weather", {"city": "def f():\n    return '<b>'\n"})],
        "",
        TOOLS,
    ),
    ToolCase(
        "qwen3_coder",
        "bare function",
        "<function=get_weather>\n<parameter=city>\nRome\n</parameter>\n</function>",
        [("get_weather", {"city": "Rome"})],
        "",
        TOOLS,
    ),
    ToolCase(
        "qwen3_coder",
        "unclosed tool_call",
        "<tool_call>\n<function=get_weather>\n<parameter=city>\nLima\n</parameter>\n</function>\n",
        [("get_weather", {"city": "Lima"})],
        "",
        TOOLS,
    ),
    ToolCase(
        "qwen3_coder",
        "malformed unclosed function",
        "<tool_call>\n<function=get_weather>\n<parameter=city>\nLima",
        [],
        "<tool_call>\n<function=get_weather>\n<parameter=city>\nLima",
        TOOLS,
        vllm=(
            [("get_weather", {})],
            "vLLM credits a call the model never finished (without the open parameter); the farm keeps it prose",
        ),
    ),
    ToolCase(
        "qwen3_coder", "prose only", "No tools <b>needed</b> < here.", [], "No tools <b>needed</b> < here.", TOOLS
    ),
]

# ---------------------------------------------------------------- llama3_json

LLAMA3_JSON = [
    ToolCase("llama3_json", "single", LLAMA_CALL, [("get_weather", {"city": "Tokyo", "days": 3})], ""),
    ToolCase(
        "llama3_json", "python tag", "<|python_tag|>" + LLAMA_CALL, [("get_weather", {"city": "Tokyo", "days": 3})], ""
    ),
    ToolCase(
        "llama3_json",
        "parallel",
        LLAMA_CALL + '; {"name": "list_files", "parameters": {}}',
        [("get_weather", {"city": "Tokyo", "days": 3}), ("list_files", {})],
        "",
    ),
    ToolCase(
        "llama3_json",
        "prose before",
        "Sure, calling it: " + LLAMA_CALL,
        [("get_weather", {"city": "Tokyo", "days": 3})],
        "Sure, calling it: ",
    ),
    ToolCase(
        "llama3_json",
        "prose after",
        LLAMA_CALL + " and done.",
        [("get_weather", {"city": "Tokyo", "days": 3})],
        " and done.",
    ),
    ToolCase(
        "llama3_json",
        "nested json",
        '{"name": "get_weather", "arguments": {"filter": '
        + '{"a": [1, {"b": null, "c": "x}y"}], "d": {"e": true}}'
        + "}}",
        [("get_weather", {"filter": NESTED})],
        "",
    ),
    ToolCase(
        "llama3_json",
        "unicode",
        '{"name": "get_weather", "parameters": {"city": "' + UNICODE_CITY + '"}}',
        [("get_weather", {"city": UNICODE_CITY})],
        "",
    ),
    ToolCase(
        "llama3_json",
        "malformed unclosed",
        '{"name": "get_weather", "parameters": {"city": "Tokyo"',
        [],
        '{"name": "get_weather", "parameters": {"city": "Tokyo"',
    ),
    ToolCase("llama3_json", "object not a call", 'Use {"a": 1} as the config.', [], 'Use {"a": 1} as the config.'),
    ToolCase("llama3_json", "prose only", "Plain answer, no braces.", [], "Plain answer, no braces."),
    ToolCase(
        "llama3_json",
        "call after other braces",
        "In {curly} words: " + LLAMA_CALL,
        [("get_weather", {"city": "Tokyo", "days": 3})],
        "In {curly} words: ",
        vllm=([], "vLLM gives up on every call once one brace is not JSON; the farm reads each object alone"),
    ),
]

# ---------------------------------------------------------------- deepseek_v31


DEEPSEEK_V31 = [
    ToolCase(
        "deepseek_v31",
        "single",
        DS_OPEN + ds("get_weather", '{"city": "Tokyo"}') + DS_CLOSE,
        [("get_weather", {"city": "Tokyo"})],
        "",
    ),
    ToolCase(
        "deepseek_v31",
        "parallel",
        DS_OPEN + ds("get_weather", '{"city": "Tokyo"}') + ds("list_files", "{}") + DS_CLOSE,
        [("get_weather", {"city": "Tokyo"}), ("list_files", {})],
        "",
    ),
    ToolCase(
        "deepseek_v31",
        "prose before",
        "Let me look." + DS_OPEN + ds("list_files", "{}") + DS_CLOSE,
        [("list_files", {})],
        "Let me look.",
    ),
    ToolCase(
        "deepseek_v31",
        "nested json",
        DS_OPEN + ds("get_weather", '{"filter": {"a": [1, {"b": null, "c": "x}y"}], "d": {"e": true}}}') + DS_CLOSE,
        [("get_weather", {"filter": NESTED})],
        "",
    ),
    ToolCase(
        "deepseek_v31",
        "unicode",
        DS_OPEN + ds("get_weather", '{"city": "' + UNICODE_CITY + '"}') + DS_CLOSE,
        [("get_weather", {"city": UNICODE_CITY})],
        "",
    ),
    ToolCase("deepseek_v31", "unclosed section", DS_OPEN + ds("list_files", "{}"), [("list_files", {})], ""),
    ToolCase(
        "deepseek_v31",
        "unfinished call",
        DS_OPEN + "<｜tool▁call▁begin｜>list_files<｜tool▁sep｜>{",
        [],
        DS_OPEN + "<｜tool▁call▁begin｜>list_files<｜tool▁sep｜>{",
    ),
    ToolCase(
        "deepseek_v31",
        "malformed arguments",
        DS_OPEN + ds("get_weather", "{city: Tokyo}") + DS_CLOSE,
        [],
        DS_OPEN + ds("get_weather", "{city: Tokyo}") + DS_CLOSE,
        vllm=(
            [("get_weather", {"<unparsed>": "{city: Tokyo}"})],
            "vLLM passes arguments that are not JSON on as a call; the farm keeps them prose",
        ),
    ),
    ToolCase("deepseek_v31", "prose only", "Nothing to call here.", [], "Nothing to call here."),
]

# ---------------------------------------------------------------- glm45


GLM45 = [
    ToolCase(
        "glm45",
        "single typed",
        glm("get_weather", city="Tokyo", days="3"),
        [("get_weather", {"city": "Tokyo", "days": 3})],
        "",
        TOOLS,
    ),
    ToolCase(
        "glm45",
        "single untyped",
        glm("get_weather", city="Tokyo", days="3"),
        [("get_weather", {"city": "Tokyo", "days": "3"})],
        "",
    ),
    ToolCase(
        "glm45",
        "glm47 no newlines",
        glm("get_weather", "", city="Tokyo"),
        [("get_weather", {"city": "Tokyo"})],
        "",
        TOOLS,
    ),
    ToolCase(
        "glm45",
        "parallel",
        glm("get_weather", city="Paris") + "\n" + glm("list_files"),
        [("get_weather", {"city": "Paris"}), ("list_files", {})],
        "\n",
        TOOLS,
    ),
    ToolCase(
        "glm45",
        "prose around",
        "Checking.\n" + glm("get_weather", city="Oslo") + "\nDone.",
        [("get_weather", {"city": "Oslo"})],
        "Checking.\n\nDone.",
        TOOLS,
    ),
    ToolCase(
        "glm45",
        "nested json",
        glm("get_weather", filter='{"a": [1, {"b": null, "c": "x}y"}], "d": {"e": true}}', hours="[3]"),
        [("get_weather", {"filter": NESTED, "hours": [3]})],
        "",
        TOOLS,
    ),
    ToolCase(
        "glm45", "unicode", glm("get_weather", city=UNICODE_CITY), [("get_weather", {"city": UNICODE_CITY})], "", TOOLS
    ),
    ToolCase("glm45", "unknown tool", glm("launch_rocket", city="x"), [], glm("launch_rocket", city="x"), TOOLS),
    ToolCase(
        "glm45",
        "malformed unclosed",
        "<tool_call>get_weather\n<arg_key>city</arg_key>\n<arg_value>Tokyo</arg_value>",
        [],
        "<tool_call>get_weather\n<arg_key>city</arg_key>\n<arg_value>Tokyo</arg_value>",
        TOOLS,
        vllm=(
            [("get_weather", {"city": "Tokyo"})],
            "vLLM credits a call the model never finished; the farm keeps it prose",
        ),
    ),
]

# ---------------------------------------------------------------- kimi_k2


KIMI_K2 = [
    ToolCase(
        "kimi_k2",
        "single",
        KS_OPEN + kimi("functions.get_weather:0", '{"city": "Tokyo"}') + KS_CLOSE,
        [("get_weather", {"city": "Tokyo"})],
        "",
        TOOLS,
    ),
    ToolCase(
        "kimi_k2",
        "parallel",
        KS_OPEN
        + kimi("functions.get_weather:0", '{"city": "Tokyo"}')
        + kimi("functions.list_files:1", "{}")
        + KS_CLOSE,
        [("get_weather", {"city": "Tokyo"}), ("list_files", {})],
        "",
        TOOLS,
    ),
    ToolCase(
        "kimi_k2",
        "prose before",
        "Let me check. " + KS_OPEN + kimi("functions.list_files:0", "{}") + KS_CLOSE,
        [("list_files", {})],
        "Let me check. ",
        TOOLS,
    ),
    ToolCase(
        "kimi_k2",
        "typed by schema",
        KS_OPEN + kimi("functions.get_weather:0", '{"city": 5, "days": "3", "metric": "false"}') + KS_CLOSE,
        [("get_weather", {"city": "5", "days": 3, "metric": False})],
        "",
        TOOLS,
    ),
    ToolCase(
        "kimi_k2",
        "nested json",
        KS_OPEN
        + kimi("functions.get_weather:0", '{"filter": {"a": [1, {"b": null, "c": "x}y"}], "d": {"e": true}}}')
        + KS_CLOSE,
        [("get_weather", {"filter": NESTED})],
        "",
        TOOLS,
    ),
    ToolCase(
        "kimi_k2",
        "unicode",
        KS_OPEN + kimi("functions.get_weather:0", '{"city": "' + UNICODE_CITY + '"}') + KS_CLOSE,
        [("get_weather", {"city": UNICODE_CITY})],
        "",
        TOOLS,
    ),
    ToolCase(
        "kimi_k2",
        "no index",
        KS_OPEN + kimi("functions.get_weather", "{}") + KS_CLOSE,
        [],
        KS_OPEN + kimi("functions.get_weather", "{}") + KS_CLOSE,
        TOOLS,
    ),
    ToolCase(
        "kimi_k2",
        "malformed arguments",
        KS_OPEN + kimi("functions.get_weather:0", "{city: Tokyo}") + KS_CLOSE,
        [],
        KS_OPEN + kimi("functions.get_weather:0", "{city: Tokyo}") + KS_CLOSE,
        TOOLS,
        vllm=(
            [("get_weather", {"<unparsed>": "{city: Tokyo}"})],
            "vLLM passes arguments that are not JSON on as a call; the farm keeps them prose",
        ),
    ),
]

# ---------------------------------------------------------------- mistral

MISTRAL = [
    ToolCase(
        "mistral",
        "list single",
        '[TOOL_CALLS][{"name": "get_weather", "arguments": {"city": "Tokyo"}}]',
        [("get_weather", {"city": "Tokyo"})],
        "",
    ),
    ToolCase(
        "mistral",
        "list parallel",
        '[TOOL_CALLS] [{"name": "get_weather", "arguments": {"city": "Tokyo"}}, '
        '{"name": "list_files", "arguments": {}}]',
        [("get_weather", {"city": "Tokyo"}), ("list_files", {})],
        "",
    ),
    ToolCase(
        "mistral",
        "list prose before, nested, unicode",
        'Sure. [TOOL_CALLS][{"name": "get_weather", "arguments": {"city": "'
        + UNICODE_CITY
        + '", "filter": {"a": [1, {"b": null, "c": "x}y"}], "d": {"e": true}}}}]',
        [("get_weather", {"city": UNICODE_CITY, "filter": NESTED})],
        "Sure. ",
    ),
    ToolCase(
        "mistral",
        "list malformed",
        '[TOOL_CALLS][{"name": "get_weather", "arguments": {"city": ',
        [],
        '[TOOL_CALLS][{"name": "get_weather", "arguments": {"city": ',
    ),
    ToolCase(
        "mistral",
        "v11 single",
        '[TOOL_CALLS]get_weather[ARGS]{"city": "Tokyo"}',
        [("get_weather", {"city": "Tokyo"})],
        "",
        mistral_v11=True,
    ),
    ToolCase(
        "mistral",
        "v11 parallel",
        '[TOOL_CALLS]get_weather[ARGS]{"city": "Tokyo"}[TOOL_CALLS]list_files[ARGS]{}',
        [("get_weather", {"city": "Tokyo"}), ("list_files", {})],
        "",
        mistral_v11=True,
    ),
    ToolCase(
        "mistral",
        "v11 prose before, nested, unicode",
        'Sure. [TOOL_CALLS]get_weather[ARGS]{"city": "'
        + UNICODE_CITY
        + '", "filter": {"a": [1, {"b": null, "c": "x}y"}], "d": {"e": true}}}',
        [("get_weather", {"city": UNICODE_CITY, "filter": NESTED})],
        "Sure. ",
        mistral_v11=True,
    ),
    ToolCase(
        "mistral",
        "v11 typed by schema",
        '[TOOL_CALLS]get_weather[ARGS]{"city": "Tokyo", "days": "2"}',
        [("get_weather", {"city": "Tokyo", "days": 2})],
        "",
        TOOLS,
        mistral_v11=True,
    ),
    ToolCase(
        "mistral",
        "v11 malformed",
        '[TOOL_CALLS]get_weather[ARGS]{"city": "Tok',
        [],
        '[TOOL_CALLS]get_weather[ARGS]{"city": "Tok',
        mistral_v11=True,
        vllm=(
            [("get_weather", {"<unparsed>": '{"city": "Tok'})],
            "vLLM credits a call whose JSON never closed; the farm keeps it prose",
        ),
    ),
]

# ---------------------------------------------------------------- openai (harmony)

OPENAI = [
    ToolCase("openai", "single", ANALYSIS + HARMONY_CALL, [("get_weather", {"city": "Tokyo"})], ""),
    ToolCase(
        "openai",
        "recipient in the role",
        ANALYSIS + ' to=functions.get_weather<|channel|>commentary json<|message|>{"city": "Tokyo"}<|call|>',
        [("get_weather", {"city": "Tokyo"})],
        "",
    ),
    ToolCase("openai", "final only", "<|channel|>final<|message|>Hello there.<|return|>", [], "Hello there."),
    ToolCase(
        "openai",
        "preamble then call",
        "<|channel|>commentary<|message|>Checking the weather.<|end|><|start|>assistant" + HARMONY_CALL,
        [("get_weather", {"city": "Tokyo"})],
        "Checking the weather.",
    ),
    ToolCase(
        "openai",
        "nested, unicode",
        ANALYSIS
        + '<|channel|>commentary to=functions.get_weather <|constrain|>json<|message|>{"city": "'
        + UNICODE_CITY
        + '", "filter": {"a": [1, {"b": null, "c": "x}y"}], "d": {"e": true}}}<|call|>',
        [("get_weather", {"city": UNICODE_CITY, "filter": NESTED})],
        "",
    ),
    ToolCase(
        "openai",
        "malformed arguments",
        ANALYSIS + "<|channel|>commentary to=functions.get_weather <|constrain|>json<|message|>{city: Tokyo}<|call|>",
        [],
        "",
        vllm=(
            [("get_weather", {"<unparsed>": "{city: Tokyo}"})],
            "vLLM passes arguments that are not JSON on as a call; the farm drops the message",
        ),
    ),
]

# ---------------------------------------------------------------- hermes (the farm's first format)

HERMES = [
    ToolCase("hermes", "single", HERMES_CALL, [("get_weather", {"city": "Tokyo"})], ""),
    ToolCase(
        "hermes",
        "parallel, prose around",
        "Checking. " + HERMES_CALL + "\n" + HERMES_CALL.replace("Tokyo", UNICODE_CITY) + " Done.",
        [("get_weather", {"city": "Tokyo"}), ("get_weather", {"city": UNICODE_CITY})],
        "Checking. \n Done.",
    ),
    ToolCase(
        "hermes",
        "nested json",
        '<tool_call>{"name": "get_weather", "arguments": {"filter": {"a": [1, {"b": null, "c": "x}y"}], '
        '"d": {"e": true}}}}</tool_call>',
        [("get_weather", {"filter": NESTED})],
        "",
    ),
    ToolCase("hermes", "malformed", "<tool_call>{not json}</tool_call>", [], "<tool_call>{not json}</tool_call>"),
]

TOOL_CASES = HERMES + QWEN3_CODER + LLAMA3_JSON + DEEPSEEK_V31 + GLM45 + KIMI_K2 + MISTRAL + OPENAI + EDGES
