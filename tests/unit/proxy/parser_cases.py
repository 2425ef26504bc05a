"""Model outputs per tool-call and reasoning format, shared by the unit tests and the vLLM agreement test.

Each tool case is the text a model of that family writes, the request's tools (None: no schema),
and what the farm reads from it: the calls (name, arguments as parsed JSON) and the prose. Where
vLLM's parser reads a case differently on purpose, ``vllm`` says what vLLM finds and why the farm
does not follow (the agreement test checks that the difference is exactly that).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

Call = tuple[str, dict[str, Any]]


@dataclass(frozen=True)
class ToolCase:
    parser: str
    name: str
    text: str
    calls: list[Call]
    prose: str
    tools: list[dict[str, Any]] | None = None
    #: vLLM's parser picks Mistral's dialect by the vocabulary: True runs it with ``[ARGS]`` in it.
    mistral_v11: bool = False
    #: (vLLM's calls, why the farm differs) where the farm deliberately reads the text otherwise.
    vllm: tuple[list[Call], str] | None = None


@dataclass(frozen=True)
class ReasoningCase:
    parser: str
    name: str
    text: str
    reasoning: str
    content: str
    #: False: the request turned thinking off (``chat_template_kwargs``).
    thinking: bool = True
    #: (vLLM's reasoning, vLLM's content, why the farm differs).
    vllm: tuple[str, str, str] | None = field(default=None)


def weather_tools() -> list[dict[str, Any]]:
    props = {
        "city": {"type": "string"},
        "days": {"type": "integer"},
        "metric": {"type": "boolean"},
        "filter": {"type": "object"},
        "hours": {"type": "array", "items": {"type": "integer"}},
        "ratio": {"type": ["number", "null"]},
    }
    return [
        {
            "type": "function",
            "function": {"name": "get_weather", "parameters": {"type": "object", "properties": props}},
        },
        {"type": "function", "function": {"name": "list_files", "parameters": {"type": "object", "properties": {}}}},
    ]


TOOLS = weather_tools()
NESTED = {"a": [1, {"b": None, "c": "x}y"}], "d": {"e": True}}
UNICODE_CITY = "東京 🌸 «Ça»"

# ---------------------------------------------------------------- qwen3_coder


def _qc(name: str, **params: str) -> str:
    body = "".join(f"<parameter={k}>\n{v}\n</parameter>\n" for k, v in params.items())
    return f"<tool_call>\n<function={name}>\n{body}</function>\n</tool_call>"


QWEN3_CODER = [
    ToolCase(
        "qwen3_coder",
        "single typed",
        _qc("get_weather", city="Tokyo", days="3"),
        [("get_weather", {"city": "Tokyo", "days": 3})],
        "",
        TOOLS,
    ),
    ToolCase(
        "qwen3_coder",
        "single untyped",
        _qc("get_weather", city="Tokyo", days="3"),
        [("get_weather", {"city": "Tokyo", "days": "3"})],
        "",
    ),
    ToolCase(
        "qwen3_coder",
        "parallel",
        _qc("get_weather", city="Paris") + "\n" + _qc("list_files"),
        [("get_weather", {"city": "Paris"}), ("list_files", {})],
        "\n",
        TOOLS,
    ),
    ToolCase(
        "qwen3_coder",
        "prose around",
        "Let me check.\n" + _qc("get_weather", city="Oslo", metric="true") + "\nDone.",
        [("get_weather", {"city": "Oslo", "metric": True})],
        "Let me check.\n\nDone.",
        TOOLS,
    ),
    ToolCase(
        "qwen3_coder",
        "nested json",
        _qc(
            "get_weather", filter='{"a": [1, {"b": null, "c": "x}y"}], "d": {"e": true}}', hours="[1, 2]", ratio="null"
        ),
        [("get_weather", {"filter": NESTED, "hours": [1, 2], "ratio": None})],
        "",
        TOOLS,
    ),
    ToolCase(
        "qwen3_coder",
        "unicode",
        "Ça va? " + _qc("get_weather", city=UNICODE_CITY),
        [("get_weather", {"city": UNICODE_CITY})],
        "Ça va? ",
        TOOLS,
    ),
    ToolCase(
        "qwen3_coder",
        "multiline value",
        _qc("get_weather", city="def f():\n    return '<b>'\n"),
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

_LW = '{"name": "get_weather", "parameters": {"city": "Tokyo", "days": 3}}'
LLAMA3_JSON = [
    ToolCase("llama3_json", "single", _LW, [("get_weather", {"city": "Tokyo", "days": 3})], ""),
    ToolCase("llama3_json", "python tag", "<|python_tag|>" + _LW, [("get_weather", {"city": "Tokyo", "days": 3})], ""),
    ToolCase(
        "llama3_json",
        "parallel",
        _LW + '; {"name": "list_files", "parameters": {}}',
        [("get_weather", {"city": "Tokyo", "days": 3}), ("list_files", {})],
        "",
    ),
    ToolCase(
        "llama3_json",
        "prose before",
        "Sure, calling it: " + _LW,
        [("get_weather", {"city": "Tokyo", "days": 3})],
        "Sure, calling it: ",
    ),
    ToolCase(
        "llama3_json", "prose after", _LW + " and done.", [("get_weather", {"city": "Tokyo", "days": 3})], " and done."
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
        "In {curly} words: " + _LW,
        [("get_weather", {"city": "Tokyo", "days": 3})],
        "In {curly} words: ",
        vllm=([], "vLLM gives up on every call once one brace is not JSON; the farm reads each object alone"),
    ),
]

# ---------------------------------------------------------------- deepseek_v31

DS_OPEN, DS_CLOSE = "<｜tool▁calls▁begin｜>", "<｜tool▁calls▁end｜>"


def _ds(name: str, args: str) -> str:
    return f"<｜tool▁call▁begin｜>{name}<｜tool▁sep｜>{args}<｜tool▁call▁end｜>"


DEEPSEEK_V31 = [
    ToolCase(
        "deepseek_v31",
        "single",
        DS_OPEN + _ds("get_weather", '{"city": "Tokyo"}') + DS_CLOSE,
        [("get_weather", {"city": "Tokyo"})],
        "",
    ),
    ToolCase(
        "deepseek_v31",
        "parallel",
        DS_OPEN + _ds("get_weather", '{"city": "Tokyo"}') + _ds("list_files", "{}") + DS_CLOSE,
        [("get_weather", {"city": "Tokyo"}), ("list_files", {})],
        "",
    ),
    ToolCase(
        "deepseek_v31",
        "prose before",
        "Let me look." + DS_OPEN + _ds("list_files", "{}") + DS_CLOSE,
        [("list_files", {})],
        "Let me look.",
    ),
    ToolCase(
        "deepseek_v31",
        "nested json",
        DS_OPEN + _ds("get_weather", '{"filter": {"a": [1, {"b": null, "c": "x}y"}], "d": {"e": true}}}') + DS_CLOSE,
        [("get_weather", {"filter": NESTED})],
        "",
    ),
    ToolCase(
        "deepseek_v31",
        "unicode",
        DS_OPEN + _ds("get_weather", '{"city": "' + UNICODE_CITY + '"}') + DS_CLOSE,
        [("get_weather", {"city": UNICODE_CITY})],
        "",
    ),
    ToolCase("deepseek_v31", "unclosed section", DS_OPEN + _ds("list_files", "{}"), [("list_files", {})], ""),
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
        DS_OPEN + _ds("get_weather", "{city: Tokyo}") + DS_CLOSE,
        [],
        DS_OPEN + _ds("get_weather", "{city: Tokyo}") + DS_CLOSE,
        vllm=(
            [("get_weather", {"<unparsed>": "{city: Tokyo}"})],
            "vLLM passes arguments that are not JSON on as a call; the farm keeps them prose",
        ),
    ),
    ToolCase("deepseek_v31", "prose only", "Nothing to call here.", [], "Nothing to call here."),
]

# ---------------------------------------------------------------- glm45


def _glm(name: str, sep: str = "\n", **args: str) -> str:
    body = "".join(f"<arg_key>{k}</arg_key>{sep}<arg_value>{v}</arg_value>{sep}" for k, v in args.items())
    return f"<tool_call>{name}{sep}{body}</tool_call>"


GLM45 = [
    ToolCase(
        "glm45",
        "single typed",
        _glm("get_weather", city="Tokyo", days="3"),
        [("get_weather", {"city": "Tokyo", "days": 3})],
        "",
        TOOLS,
    ),
    ToolCase(
        "glm45",
        "single untyped",
        _glm("get_weather", city="Tokyo", days="3"),
        [("get_weather", {"city": "Tokyo", "days": "3"})],
        "",
    ),
    ToolCase(
        "glm45",
        "glm47 no newlines",
        _glm("get_weather", "", city="Tokyo"),
        [("get_weather", {"city": "Tokyo"})],
        "",
        TOOLS,
    ),
    ToolCase(
        "glm45",
        "parallel",
        _glm("get_weather", city="Paris") + "\n" + _glm("list_files"),
        [("get_weather", {"city": "Paris"}), ("list_files", {})],
        "\n",
        TOOLS,
    ),
    ToolCase(
        "glm45",
        "prose around",
        "Checking.\n" + _glm("get_weather", city="Oslo") + "\nDone.",
        [("get_weather", {"city": "Oslo"})],
        "Checking.\n\nDone.",
        TOOLS,
    ),
    ToolCase(
        "glm45",
        "nested json",
        _glm("get_weather", filter='{"a": [1, {"b": null, "c": "x}y"}], "d": {"e": true}}', hours="[3]"),
        [("get_weather", {"filter": NESTED, "hours": [3]})],
        "",
        TOOLS,
    ),
    ToolCase(
        "glm45", "unicode", _glm("get_weather", city=UNICODE_CITY), [("get_weather", {"city": UNICODE_CITY})], "", TOOLS
    ),
    ToolCase("glm45", "unknown tool", _glm("launch_rocket", city="x"), [], _glm("launch_rocket", city="x"), TOOLS),
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

KS_OPEN, KS_CLOSE = "<|tool_calls_section_begin|>", "<|tool_calls_section_end|>"


def _kimi(header: str, args: str) -> str:
    return f"<|tool_call_begin|>{header}<|tool_call_argument_begin|>{args}<|tool_call_end|>"


KIMI_K2 = [
    ToolCase(
        "kimi_k2",
        "single",
        KS_OPEN + _kimi("functions.get_weather:0", '{"city": "Tokyo"}') + KS_CLOSE,
        [("get_weather", {"city": "Tokyo"})],
        "",
        TOOLS,
    ),
    ToolCase(
        "kimi_k2",
        "parallel",
        KS_OPEN
        + _kimi("functions.get_weather:0", '{"city": "Tokyo"}')
        + _kimi("functions.list_files:1", "{}")
        + KS_CLOSE,
        [("get_weather", {"city": "Tokyo"}), ("list_files", {})],
        "",
        TOOLS,
    ),
    ToolCase(
        "kimi_k2",
        "prose before",
        "Let me check. " + KS_OPEN + _kimi("functions.list_files:0", "{}") + KS_CLOSE,
        [("list_files", {})],
        "Let me check. ",
        TOOLS,
    ),
    ToolCase(
        "kimi_k2",
        "typed by schema",
        KS_OPEN + _kimi("functions.get_weather:0", '{"city": 5, "days": "3", "metric": "false"}') + KS_CLOSE,
        [("get_weather", {"city": "5", "days": 3, "metric": False})],
        "",
        TOOLS,
    ),
    ToolCase(
        "kimi_k2",
        "nested json",
        KS_OPEN
        + _kimi("functions.get_weather:0", '{"filter": {"a": [1, {"b": null, "c": "x}y"}], "d": {"e": true}}}')
        + KS_CLOSE,
        [("get_weather", {"filter": NESTED})],
        "",
        TOOLS,
    ),
    ToolCase(
        "kimi_k2",
        "unicode",
        KS_OPEN + _kimi("functions.get_weather:0", '{"city": "' + UNICODE_CITY + '"}') + KS_CLOSE,
        [("get_weather", {"city": UNICODE_CITY})],
        "",
        TOOLS,
    ),
    ToolCase(
        "kimi_k2",
        "no index",
        KS_OPEN + _kimi("functions.get_weather", "{}") + KS_CLOSE,
        [],
        KS_OPEN + _kimi("functions.get_weather", "{}") + KS_CLOSE,
        TOOLS,
    ),
    ToolCase(
        "kimi_k2",
        "malformed arguments",
        KS_OPEN + _kimi("functions.get_weather:0", "{city: Tokyo}") + KS_CLOSE,
        [],
        KS_OPEN + _kimi("functions.get_weather:0", "{city: Tokyo}") + KS_CLOSE,
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

_AN = "<|channel|>analysis<|message|>Need the weather.<|end|><|start|>assistant"
_CALL = '<|channel|>commentary to=functions.get_weather <|constrain|>json<|message|>{"city": "Tokyo"}<|call|>'
OPENAI = [
    ToolCase("openai", "single", _AN + _CALL, [("get_weather", {"city": "Tokyo"})], ""),
    ToolCase(
        "openai",
        "recipient in the role",
        _AN + ' to=functions.get_weather<|channel|>commentary json<|message|>{"city": "Tokyo"}<|call|>',
        [("get_weather", {"city": "Tokyo"})],
        "",
    ),
    ToolCase("openai", "final only", "<|channel|>final<|message|>Hello there.<|return|>", [], "Hello there."),
    ToolCase(
        "openai",
        "preamble then call",
        "<|channel|>commentary<|message|>Checking the weather.<|end|><|start|>assistant" + _CALL,
        [("get_weather", {"city": "Tokyo"})],
        "Checking the weather.",
    ),
    ToolCase(
        "openai",
        "nested, unicode",
        _AN
        + '<|channel|>commentary to=functions.get_weather <|constrain|>json<|message|>{"city": "'
        + UNICODE_CITY
        + '", "filter": {"a": [1, {"b": null, "c": "x}y"}], "d": {"e": true}}}<|call|>',
        [("get_weather", {"city": UNICODE_CITY, "filter": NESTED})],
        "",
    ),
    ToolCase(
        "openai",
        "malformed arguments",
        _AN + "<|channel|>commentary to=functions.get_weather <|constrain|>json<|message|>{city: Tokyo}<|call|>",
        [],
        "",
        vllm=(
            [("get_weather", {"<unparsed>": "{city: Tokyo}"})],
            "vLLM passes arguments that are not JSON on as a call; the farm drops the message",
        ),
    ),
]

# ---------------------------------------------------------------- hermes (the farm's first format)

_H = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Tokyo"}}\n</tool_call>'
HERMES = [
    ToolCase("hermes", "single", _H, [("get_weather", {"city": "Tokyo"})], ""),
    ToolCase(
        "hermes",
        "parallel, prose around",
        "Checking. " + _H + "\n" + _H.replace("Tokyo", UNICODE_CITY) + " Done.",
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

# ---------------------------------------------------------------- edges, each format

EDGES = [
    ToolCase(
        "qwen3_coder",
        "partial tags in prose",
        "a <tool b <function c [TOOL_CALLS] d <|x|> e",
        [],
        "a <tool b <function c [TOOL_CALLS] d <|x|> e",
    ),
    ToolCase("qwen3_coder", "no parameters", _qc("list_files"), [("list_files", {})], "", TOOLS),
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
        _qc("get_weather", city="\n  spaced  \n"),
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
        KS_OPEN + "\n" + _kimi("functions.list_files:0", "{}") + "\n" + KS_CLOSE,
        [("list_files", {})],
        "",
        TOOLS,
    ),
    ToolCase(
        "kimi_k2", "unclosed section", KS_OPEN + _kimi("functions.list_files:0", "{}"), [("list_files", {})], "", TOOLS
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
        DS_OPEN + _ds("list_files", "{}") + DS_CLOSE + " after",
        [("list_files", {})],
        " after",
    ),
    ToolCase(
        "deepseek_v31",
        "arguments over several lines",
        DS_OPEN + _ds("get_weather", '{\n  "city": "Tokyo"\n}') + DS_CLOSE,
        [("get_weather", {"city": "Tokyo"})],
        "",
        vllm=([], "vLLM bug: its regex lacks DOTALL, so a call whose JSON arguments span lines is dropped"),
    ),
    ToolCase(
        "qwen3_coder",
        "tool not offered",
        _qc("launch_rocket", fuel="3"),
        [("launch_rocket", {"fuel": "3"})],
        "",
        TOOLS,
    ),
    ToolCase(
        "kimi_k2",
        "tool not offered",
        KS_OPEN + _kimi("functions.launch_rocket:0", "{}") + KS_CLOSE,
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
        DS_OPEN + _ds("list_files", "{}") + "<｜tool▁call▁begin｜>run<｜tool▁sep｜>{",
        [("list_files", {})],
        "<｜tool▁call▁begin｜>run<｜tool▁sep｜>{",
    ),
    ToolCase(
        "kimi_k2",
        "unclosed section, second call cut off",
        KS_OPEN
        + _kimi("functions.list_files:0", "{}")
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
        _AN
        + _CALL
        + "<|start|>assistant"
        + _CALL.replace("get_weather", "list_files").replace('{"city": "Tokyo"}', "{}"),
        [("get_weather", {"city": "Tokyo"}), ("list_files", {})],
        "",
    ),
]

TOOL_CASES = HERMES + QWEN3_CODER + LLAMA3_JSON + DEEPSEEK_V31 + GLM45 + KIMI_K2 + MISTRAL + OPENAI + EDGES

# ---------------------------------------------------------------- reasoning

_TC = '<tool_call>\n{"name": "list_files", "arguments": {}}\n</tool_call>'
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
        "<think>Need files. " + KS_OPEN + _kimi("functions.list_files:0", "{}") + KS_CLOSE,
        "Need files.",
        KS_OPEN + _kimi("functions.list_files:0", "{}") + KS_CLOSE,
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
        "qwen3", "tool call after reasoning", "<think>Need files.</think>\n\n" + _TC, "Need files.", "\n\n" + _TC
    ),
    ReasoningCase("qwen3", "tool call ends reasoning", "<think>Need files." + _TC, "Need files.", _TC),
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
    ReasoningCase("openai_gptoss", "analysis then call", _AN + _CALL, "Need the weather.", ""),
]
