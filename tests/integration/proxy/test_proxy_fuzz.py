"""A property-based fuzzer of the proxy's five routes (issue 30; opt-in: ``--run-proxy-fuzz``).

hypothesis builds request bodies from each format's request shape, with hostile leaves (lone
surrogates escaped and raw, NaN, Infinity, 1e400, NUL, deep nesting, wrong types, long strings
within the body limit, unknown fields, streamed or not) and raw bytes, and posts them to a real
farm on the tiny model with small bounds and small ``max_tokens`` (each case cheap). Every answer
must come within a timeout (no hang), none may be a 5xx, every 4xx must be in its format's error
shape; after the run a normal call is still a 200. The figures (cases, 5xx, hangs, each process's
RSS before and after) are printed for the CI log (``-s``).
"""

from __future__ import annotations

import json
import math
import os
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st

from farm.embedded import EmbeddedStack
from tests.integration.conftest import side_redis_url, stack_settings

pytestmark = [pytest.mark.integration, pytest.mark.proxy_fuzz, pytest.mark.timeout(1800)]

TOKEN = {"Authorization": "Bearer e2e-token"}
USER = [{"role": "user", "content": "hi"}]
LIMITS = {
    "max_body_bytes": 64 * 1024,
    "max_messages": 20,
    "max_tools": 8,
    "max_json_depth": 24,
    "max_prompt_tokens": 64,
    "read_timeout_s": 5.0,
}
ROUTES = ("chat/completions", "completions", "responses", "messages", "messages/count_tokens")
#: cases over the five routes together (the issue asks for at least 5,000 per CI run).
CASES = int(os.environ.get("FARM_PROXY_FUZZ_CASES", "5000"))
#: an answer later than this is a hang (a streamed one read whole).
ANSWER_TIMEOUT_S = 30.0
MIB = 1024 * 1024

# Leaves that survive json.dumps as strings and are swapped for raw JSON text after it.
RAW_TOKENS = {"<1e400>": "1e400", "<-1e400>": "-1e400", "<big-int>": "9" * 400, "<neg-zero>": "-0.0"}

hostile_text = st.one_of(
    st.text(max_size=20),
    st.sampled_from(["\ud800", "a\udfffb", "\x00", "a\x00b", "\ufeff", "\u202e", "", " ", "user", "assistant"]),
    st.text(st.characters(codec=None, categories=("Cs", "Cc", "Lo")), max_size=8),  # lone surrogates, controls
    st.sampled_from([1000, 20_000, 60_000]).map(lambda n: "x " * (n // 2)),  # long, within the body limit
)
#: numbers JSON has no way to write (NaN, Infinity) or a double cannot hold (1e400).
unwritable_number = st.sampled_from([math.nan, math.inf, -math.inf, *RAW_TOKENS])
#: a leaf of any type; an unwritable number only now and then (one makes the whole body a 400).
hostile_leaf = st.one_of(
    *[hostile_text] * 3,
    st.integers(min_value=-(2**70), max_value=2**70),
    st.floats(allow_nan=False, allow_infinity=False),
    st.booleans(),
    st.none(),
    unwritable_number,
)
tame_leaf = st.one_of(hostile_text, st.integers(), st.floats(allow_nan=False, allow_infinity=False), st.none())


def deep(leaf: Any, levels: int) -> Any:
    for index in range(levels):
        leaf = [leaf] if index % 2 else {"a": leaf}
    return leaf


any_json = st.recursive(
    tame_leaf,
    lambda inner: st.one_of(st.lists(inner, max_size=4), st.dictionaries(hostile_text, inner, max_size=4)),
    max_leaves=12,
)
nested = st.builds(deep, hostile_leaf, st.integers(min_value=10, max_value=60))
#: anything: mostly a value of the wrong type for the field it lands in.
wild = st.one_of(hostile_leaf, any_json, nested)


def field(good: st.SearchStrategy[Any]) -> st.SearchStrategy[Any]:
    """A field's value: usually one its format allows (a body with many fields is then often served
    whole), sometimes anything."""
    return st.sampled_from([False] * 20 + [True]).flatmap(lambda anything: wild if anything else good)


text = field(st.one_of(*[st.just("hi")] * 6, st.text(max_size=20), hostile_text))
role = field(st.sampled_from(["user", "assistant", "system", "developer", "tool", "function", "bogus"]))
max_tokens = field(st.integers(min_value=0, max_value=3))
stream = field(st.booleans())
extras = st.dictionaries(st.text(max_size=10).filter(lambda k: k not in ("model", "stream")), wild, max_size=3)


def openai_part() -> st.SearchStrategy[Any]:
    return st.one_of(
        st.fixed_dictionaries({"type": st.just("text"), "text": text}),
        st.fixed_dictionaries({"type": st.just("image_url"), "image_url": field(st.just({"url": "data:,x"}))}),
        wild,
    )


openai_function = st.fixed_dictionaries(
    {"name": field(st.sampled_from(["bash", "t"])), "parameters": field(st.just({"type": "object"}))},
    optional={"description": text},
)
chat_tool = st.fixed_dictionaries({"type": field(st.just("function")), "function": field(openai_function)})
chat_message = st.fixed_dictionaries(
    {"role": role, "content": field(st.one_of(text, st.lists(openai_part(), max_size=3), st.none()))},
    optional={
        "tool_calls": field(
            st.lists(
                st.fixed_dictionaries(
                    {
                        "id": text,
                        "type": st.just("function"),
                        "function": st.fixed_dictionaries({"name": text, "arguments": text}),
                    }
                ),
                max_size=2,
            )
        ),
        "tool_call_id": text,
        "name": text,
    },
)
anthropic_block = st.one_of(
    st.fixed_dictionaries({"type": st.just("text"), "text": text}),
    st.fixed_dictionaries({"type": st.just("tool_use"), "id": text, "name": text, "input": field(st.just({}))}),
    st.fixed_dictionaries({"type": st.just("tool_result"), "tool_use_id": text, "content": text}),
    st.fixed_dictionaries({"type": st.just("thinking"), "thinking": text, "signature": text}),
    wild,
)
anthropic_message = st.fixed_dictionaries(
    {
        "role": field(st.sampled_from(["user", "assistant"])),
        "content": field(st.one_of(text, st.lists(anthropic_block))),
    }
)
anthropic_tool = st.fixed_dictionaries(
    {"name": field(st.sampled_from(["bash", "t"])), "input_schema": field(st.just({"type": "object"}))},
    optional={"description": text},
)
responses_item = st.one_of(
    st.fixed_dictionaries(
        {
            "role": role,
            "content": field(
                st.one_of(text, st.lists(st.fixed_dictionaries({"type": st.just("input_text"), "text": text})))
            ),
        }
    ),
    st.fixed_dictionaries({"type": st.just("function_call"), "call_id": text, "name": text, "arguments": text}),
    st.fixed_dictionaries({"type": st.just("function_call_output"), "call_id": text, "output": text}),
    wild,
)
responses_tool = st.fixed_dictionaries(
    {
        "type": field(st.just("function")),
        "name": field(st.just("bash")),
        "parameters": field(st.just({"type": "object"})),
    }
)
sampling = {"temperature": field(st.floats(0, 2)), "top_p": field(st.floats(0, 1)), "seed": field(st.integers(0, 9))}

SHAPES: dict[str, st.SearchStrategy[dict[str, Any]]] = {
    "chat/completions": st.fixed_dictionaries(
        {"messages": field(st.lists(chat_message, min_size=1, max_size=4)), "max_tokens": max_tokens},
        optional={
            "stream": stream,
            "tools": field(st.lists(chat_tool, max_size=3)),
            "tool_choice": field(st.sampled_from(["auto", "none", "required"])),
            "logprobs": field(st.booleans()),
            "stop": field(st.lists(text, max_size=2)),
            "n": field(st.just(1)),
            **sampling,
        },
    ),
    "completions": st.fixed_dictionaries(
        {"prompt": field(st.one_of(text, st.lists(st.integers(0, 1000), max_size=8))), "max_tokens": max_tokens},
        optional={"stream": stream, "echo": field(st.booleans()), "logprobs": field(st.integers(0, 2)), **sampling},
    ),
    "responses": st.fixed_dictionaries(
        {"input": field(st.one_of(text, st.lists(responses_item, max_size=4))), "max_output_tokens": max_tokens},
        optional={
            "stream": stream,
            "instructions": text,
            "tools": field(st.lists(responses_tool, max_size=3)),
            "reasoning": field(st.fixed_dictionaries({"effort": field(st.sampled_from(["low", "high"]))})),
            "store": field(st.booleans()),
            **sampling,
        },
    ),
    "messages": st.fixed_dictionaries(
        {"messages": field(st.lists(anthropic_message, min_size=1, max_size=4)), "max_tokens": max_tokens},
        optional={
            "stream": stream,
            "system": field(st.one_of(text, st.lists(st.fixed_dictionaries({"type": st.just("text"), "text": text})))),
            "tools": field(st.lists(anthropic_tool, max_size=3)),
            "thinking": field(st.fixed_dictionaries({"type": field(st.sampled_from(["enabled", "disabled"]))})),
            **sampling,
        },
    ),
    "messages/count_tokens": st.fixed_dictionaries(
        {"messages": field(st.lists(anthropic_message, min_size=1, max_size=4))},
        optional={"system": text, "tools": field(st.lists(anthropic_tool, max_size=3))},
    ),
}


def encode(body: Any, *, raw_surrogates: bool) -> bytes:
    """``body`` as JSON bytes: NaN and Infinity as Python writes them, the raw tokens swapped in,
    surrogates escaped (``\\ud800``) or written as their raw (invalid UTF-8) bytes."""
    out = json.dumps(body, ensure_ascii=not raw_surrogates)
    for token, raw in RAW_TOKENS.items():
        out = out.replace(json.dumps(token), raw)
    return out.encode("utf-8", "surrogatepass")


def minimal(route: str, content: str) -> dict[str, Any]:
    messages = [{"role": "user", "content": content}]
    bodies: dict[str, dict[str, Any]] = {
        "chat/completions": {"messages": messages, "max_tokens": 2},
        "completions": {"prompt": content, "max_tokens": 2},
        "responses": {"input": content, "max_output_tokens": 2},
        "messages": {"messages": messages, "max_tokens": 2},
        "messages/count_tokens": {"messages": messages},
    }
    return bodies[route]


@st.composite
def request_body(draw: st.DrawFn, route: str) -> bytes:
    """A case for ``route``: a body of its shape, or bytes that are barely (or not) JSON."""
    kind = draw(
        st.sampled_from(["shape"] * 5 + ["served"] * 2 + ["one-leaf"] * 2 + ["not-an-object", "bytes", "mangled"])
    )
    if kind == "not-an-object":
        return encode(draw(wild), raw_surrogates=draw(st.booleans()))
    if kind == "bytes":
        return draw(st.binary(max_size=512))
    if kind in ("served", "one-leaf"):  # the smallest body served, with plain text (and one field of anything)
        body = {
            "model": "m",
            **minimal(route, draw(st.text(st.characters(codec="ascii"), max_size=40))),
            "stream": draw(st.booleans()),
        }
        if kind == "one-leaf":
            body[draw(st.sampled_from(sorted(body)))] = draw(wild)
        return encode(body, raw_surrogates=False)
    body = {"model": draw(field(st.just("m"))), **draw(SHAPES[route]), **draw(extras)}
    raw = encode(body, raw_surrogates=draw(st.sampled_from([False, False, False, True])))
    if kind == "mangled":  # cut short, or one byte changed
        at = draw(st.integers(0, max(len(raw) - 1, 0)))
        raw = raw[:at] if draw(st.booleans()) else raw[:at] + bytes([draw(st.integers(0, 255))]) + raw[at + 1 :]
    return raw


class Tally:
    """What the run saw: statuses per route, and each case that broke a rule (with its body)."""

    def __init__(self) -> None:
        self.cases = 0
        self.statuses: Counter[tuple[str, int]] = Counter()
        self.server_errors: list[str] = []
        self.hangs: list[str] = []
        self.bad_shapes: list[str] = []
        #: the 4xx answers' messages (their first words), to show what the cases reached.
        self.reasons: Counter[str] = Counter()


def error_shaped(route: str, resp: httpx.Response) -> bool:
    try:
        body = resp.json()
    except ValueError:
        return False
    error = body.get("error") if isinstance(body, dict) else None
    if not isinstance(error, dict) or not isinstance(error.get("message"), str):
        return False
    if route.startswith("messages"):
        return body.get("type") == "error" and isinstance(error.get("type"), str)
    return isinstance(error.get("type"), str)


def send(http: httpx.Client, url: str, key: str, route: str, raw: bytes, tally: Tally) -> None:
    tally.cases += 1
    case = f"{route}: {raw[:400]!r}"
    headers = {"Authorization": f"Bearer {key}", "Content-Type": "application/json"}
    try:
        with http.stream("POST", f"{url}/{route}", content=raw, headers=headers) as resp:
            resp.read()  # a stream read whole, within the timeout
    except httpx.TimeoutException:
        tally.hangs.append(case)
        return
    tally.statuses[(route, resp.status_code)] += 1
    if resp.status_code >= 500:
        tally.server_errors.append(f"{resp.status_code} {case} -> {resp.text[:300]}")
    elif resp.status_code >= 400:
        if error_shaped(route, resp):
            tally.reasons[" ".join(resp.json()["error"]["message"].split()[:6])] += 1
        else:
            tally.bad_shapes.append(f"{resp.status_code} {case} -> {resp.text[:300]}")


@pytest.fixture(scope="module")
def fuzz_stack(
    tmp_path_factory: pytest.TempPathFactory, module_pg_url: str, redis_url: str, tiny_model_dir: Path
) -> Iterator[EmbeddedStack]:
    """A farm of its own on the tiny model, the proxy's bounds small so each is crossed cheaply."""
    import redis

    url = side_redis_url(redis_url, 3)  # as test_proxy_hostile's; 2 is the folder's shared farm
    redis.Redis.from_url(url).flushdb()
    settings = stack_settings(
        tmp_path_factory.mktemp("fuzz-stack"),
        redis_url=url,
        database_url=module_pg_url,
        model_dir=tiny_model_dir,
        node="proxyfuzz",
    )
    settings = settings.model_copy(update={"proxy": settings.proxy.model_copy(update=LIMITS)})
    stack = EmbeddedStack(settings, with_flower=False, with_llm=True)
    stack.start()
    try:
        yield stack
    finally:
        stack.stop()
        redis.Redis.from_url(url).flushdb()


def new_trial(stack: EmbeddedStack) -> dict[str, Any]:
    with httpx.Client(base_url=stack.settings.api_url, headers=TOKEN, timeout=60) as api:
        resp = api.post("/v1/trials", json={})
        assert resp.status_code == 201, resp.text
        return dict(resp.json())


def rss_by_process(stack: EmbeddedStack) -> dict[str, int]:
    """Each of the stack's processes (and their children: the LLM backend's) by name, its RSS."""
    import psutil

    out: dict[str, int] = {}
    for service in stack.services:
        try:
            top = psutil.Process(service.process.pid)
            for proc in [top, *top.children(recursive=True)]:
                name = service.name if proc is top else f"{service.name}/{proc.pid}"
                out[name] = proc.memory_info().rss
        except psutil.NoSuchProcess:
            continue
    return out


def normal_call(http: httpx.Client, trial: dict[str, Any]) -> int:
    body = {"model": "m", "max_tokens": 2, "messages": USER}
    resp = http.post(
        f"{trial['openai_base_url']}/chat/completions", json=body, headers={"Authorization": f"Bearer {trial['key']}"}
    )
    return resp.status_code


def fuzz_route(http: httpx.Client, bases: list[str], key: str, route: str, cases: int, tally: Tally) -> None:
    """``cases`` generated bodies posted to ``route`` under each of the trial's ``bases`` in turn
    (the API's proxy routes and ``farm proxy``'s), each tallied."""

    @settings(
        max_examples=cases,
        deadline=None,
        database=None,
        derandomize=True,  # the same cases each run: a failure is found again
        phases=[Phase.explicit, Phase.generate],  # no shrinking: every case is counted, failures kept
        suppress_health_check=list(HealthCheck),
    )
    @given(raw=request_body(route))
    def fuzz(raw: bytes) -> None:
        send(http, bases[tally.cases % len(bases)], key, route, raw, tally)

    fuzz()


def test_the_proxy_survives_fuzzing_on_every_route(fuzz_stack: EmbeddedStack) -> None:
    tally = Tally()
    per_route = max(CASES // len(ROUTES), 1)
    started = time.monotonic()
    with httpx.Client(timeout=ANSWER_TIMEOUT_S) as http:
        warm = new_trial(fuzz_stack)
        assert normal_call(http, warm) == 200  # imports done, the model loaded, before the first figure
        before = rss_by_process(fuzz_stack)
        farm_proxy = f"http://127.0.0.1:{fuzz_stack.settings.proxy.port}"  # the node's own, beside the API's
        for route in ROUTES:
            trial = new_trial(fuzz_stack)  # a trial per route: one route's failed calls do not end another's

            bases = [trial["openai_base_url"], f"{farm_proxy}/proxy/{trial['id']}/v1"]
            fuzz_route(http, bases, trial["key"], route, per_route, tally)
        seconds = time.monotonic() - started
        after_trial = new_trial(fuzz_stack)
        after_status = normal_call(http, after_trial)
        after = rss_by_process(fuzz_stack)
    where = f"{len(ROUTES)} routes, half through the API and half through farm proxy"
    print(f"\nproxy fuzz: {tally.cases} cases in {seconds:.0f} s over {where}")
    for route in ROUTES:
        counts = sorted((status, n) for (r, status), n in tally.statuses.items() if r == route)
        print(f"proxy fuzz: {route}: " + ", ".join(f"{status} x{n}" for status, n in counts))
    common = ", ".join(f"{reason!r} x{n}" for reason, n in tally.reasons.most_common(8))
    print(f"proxy fuzz: the commonest 4xx: {common}")
    print(
        f"proxy fuzz: 5xx {len(tally.server_errors)}, hangs {len(tally.hangs)}, bad 4xx shapes {len(tally.bad_shapes)}"
    )
    print(f"proxy fuzz: a normal call after: {after_status}")
    for name in before:
        was, now = before[name] / MIB, after.get(name, 0) / MIB
        print(f"proxy fuzz: RSS {name}: {was:.0f} MiB before, {now:.0f} MiB after ({now - was:+.0f})")
    for line in (tally.server_errors + tally.hangs + tally.bad_shapes)[:20]:
        print(f"proxy fuzz: FAILED {line}")
    assert tally.cases >= min(CASES, 5000) - len(ROUTES)
    assert not tally.server_errors, tally.server_errors[:5]
    assert not tally.hangs, tally.hangs[:5]
    assert not tally.bad_shapes, tally.bad_shapes[:5]
    assert after_status == 200


#: schemathesis's own environment (scripts/setup_schemathesis.sh), as tests/integration/test_fuzz.py.
SCHEMATHESIS_VENV = Path(
    os.environ.get("FARM_SCHEMATHESIS_VENV", Path(__file__).resolve().parents[3] / ".venv-schemathesis")
)
#: examples per operation and phase (5 operations and the models route): 300 made 2,711 cases in 14 min
#: on 2 cores shared with other runs (load ~20), 60 made 797 in 3 min.
SCHEMATHESIS_EXAMPLES = int(os.environ.get("FARM_PROXY_SCHEMATHESIS_EXAMPLES", "150"))


@pytest.mark.fuzz
@pytest.mark.timeout(1200)
def test_schemathesis_finds_no_server_error_in_the_proxy(fuzz_stack: EmbeddedStack, tmp_path: Path) -> None:
    """schemathesis over the proxy's OpenAPI document (``farm.proxy.openapi``, as the API serves it),
    every phase and check, against a trial of the API process's proxy routes."""
    import re
    import subprocess

    schemathesis = SCHEMATHESIS_VENV / "bin" / "schemathesis"
    if not schemathesis.exists():
        pytest.skip(f"no schemathesis environment at {SCHEMATHESIS_VENV}: run scripts/setup_schemathesis.sh")
    trial = new_trial(fuzz_stack)
    before = rss_by_process(fuzz_stack)
    config = Path(__file__).with_name("schemathesis-proxy.toml")
    spec = f"{fuzz_stack.settings.api_url}/proxy/openapi.json"
    cmd = [
        str(schemathesis),
        "--config-file",
        str(config),
        "--no-color",
        "run",
        spec,
        "--url",
        trial["openai_base_url"],
    ]
    cmd += ["--checks", "all", "--header", f"Authorization: Bearer {trial['key']}", "--workers", "1"]
    cmd += ["--max-examples", str(SCHEMATHESIS_EXAMPLES), "--seed", "20261128", "--generation-database", "none"]
    # A valid call may ask for the whole context (2,048 tokens of the tiny model): seconds on 2 busy cores,
    # past the response-time check's 10 s; a hang is still one past the request timeout (a network error).
    cmd += ["--request-timeout", str(ANSWER_TIMEOUT_S), "--max-response-time", str(ANSWER_TIMEOUT_S)]
    started = time.monotonic()
    run = subprocess.run(cmd, capture_output=True, text=True, cwd=tmp_path, timeout=1100)
    seconds = time.monotonic() - started
    after = rss_by_process(fuzz_stack)
    with httpx.Client(timeout=ANSWER_TIMEOUT_S) as http:
        after_status = normal_call(http, new_trial(fuzz_stack))
    found = re.search(r"Test cases:\s*\n\s*(\d+) generated", run.stdout)
    print(f"\nproxy schemathesis: {found[1] if found else '?'} cases, exit {run.returncode}, {seconds:.0f} s")
    print(f"proxy schemathesis: a normal call after: {after_status}; command: {' '.join(cmd)}")
    for name in before:
        was, now = before[name] / MIB, after.get(name, 0) / MIB
        print(f"proxy schemathesis: RSS {name}: {was:.0f} MiB before, {now:.0f} MiB after ({now - was:+.0f})")
    print(run.stdout[-4000:])
    assert run.returncode == 0, f"{run.stdout[-20000:]}\n{run.stderr[-3000:]}"
    assert after_status == 200
