"""Requests a fuzzer found to break the proxy: each is now a 400 in its format's shape that says
what to fix, and the trial goes on serving."""

from __future__ import annotations

import json
from typing import Any

import httpx
import pytest

pytestmark = pytest.mark.integration

USER = [{"role": "user", "content": "hi"}]
BASH = {"name": "bash", "parameters": {"type": "object"}}

#: (route, body, the field the answer names or None)
BAD: list[tuple[str, dict[str, Any], str | None]] = [
    (
        "chat/completions",
        {"messages": USER, "tools": [{"type": "function", "function": {**BASH, "parameters": "x"}}]},
        "parameters",
    ),
    (
        "chat/completions",
        {"messages": USER, "tools": [{"type": "function", "function": {**BASH, "description": 5}}]},
        "description",
    ),
    ("chat/completions", {"messages": USER, "tool_choice": {"type": "function", "function": "bash"}}, None),
    ("chat/completions", {"messages": [{"role": "user", "content": "\ud800"}]}, "messages.0.content"),
    ("chat/completions", {"model": "\udfff", "messages": USER}, "model"),
    ("chat/completions", {"messages": USER, "seed": 2**70}, "seed"),
    # Each format's own name for the answer's length, not the proxy's.
    ("chat/completions", {"messages": USER, "max_completion_tokens": 2_000_000}, "max_completion_tokens"),
    ("responses", {"input": "x", "max_output_tokens": 2_000_000}, "max_output_tokens"),
    ("completions", {"prompt": "a\ud800"}, "prompt"),
    ("responses", {"input": [{"role": "user", "content": 5}]}, None),
    ("responses", {"input": []}, "input"),
    ("responses", {"input": [{"type": "function_call_output", "output": "ok"}]}, "call_id"),
    ("responses", {"input": [{"type": "function_call", "name": "bash", "arguments": "{}"}]}, "call_id"),
    ("responses", {"input": "x", "tools": [{"type": "function", "name": "bash", "parameters": "x"}]}, "parameters"),
    (
        "messages",
        {
            "max_tokens": 4,
            "messages": [{"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t", "content": 5}]}],
        },
        None,
    ),
    ("messages/count_tokens", {"messages": [{"role": "user", "content": "\ud800"}]}, "messages.0.content"),
]


def _shape_ok(route: str, body: dict[str, Any]) -> bool:
    if route.startswith("messages"):
        return body.get("type") == "error" and isinstance(body["error"]["message"], str)
    return isinstance(body.get("error", {}).get("message"), str)


@pytest.mark.parametrize(("route", "body", "field"), BAD, ids=[f"{r}-{i}" for i, (r, _, _) in enumerate(BAD)])
def test_a_bad_request_is_a_400_in_the_format_s_shape_and_the_trial_serves_on(
    new_trial: Any, route: str, body: dict[str, Any], field: str | None
) -> None:
    trial = new_trial()
    base = trial["openai_base_url"]
    headers = {"Authorization": f"Bearer {trial['key']}"}
    with httpx.Client(timeout=60) as http:
        # json= would refuse the lone surrogates: the body is written as a harness's JSON library would.
        raw = json.dumps({"model": "m", "max_tokens": 4, **body}).encode()
        answer = http.post(f"{base}/{route}", content=raw, headers={**headers, "Content-Type": "application/json"})
        assert answer.status_code == 400, answer.text
        error = answer.json()
        assert _shape_ok(route, error), error
        message = error["error"]["message"]
        if field is not None:
            assert field in message, message
        again = http.post(
            f"{base}/chat/completions", json={"model": "m", "max_tokens": 2, "messages": USER}, headers=headers
        )
        assert again.status_code == 200, again.text


def test_a_vanishing_temperature_samples_greedily_and_the_backend_serves_on(new_trial: Any) -> None:
    trial = new_trial()
    headers = {"Authorization": f"Bearer {trial['key']}"}
    url = f"{trial['openai_base_url']}/chat/completions"
    with httpx.Client(timeout=60) as http:
        for temperature in (1e-38, 2.2e-309, 1.0):
            body = {"model": "m", "max_tokens": 3, "messages": USER, "temperature": temperature}
            assert http.post(url, json=body, headers=headers).status_code == 200


def test_a_trial_id_with_a_nul_is_refused_as_unknown(new_trial: Any) -> None:
    trial = new_trial()
    base = trial["openai_base_url"].replace(trial["id"], "%00x")
    answer = httpx.get(f"{base}/models", headers={"Authorization": f"Bearer {trial['key']}"})
    assert answer.status_code == 401 and "error" in answer.json()


def test_an_unknown_route_or_method_under_a_trial_s_base_url_is_an_error_both_sdks_read(new_trial: Any) -> None:
    import anthropic
    import openai

    trial = new_trial()
    client = openai.OpenAI(base_url=trial["openai_base_url"], api_key=trial["key"], max_retries=0)
    with pytest.raises(openai.NotFoundError, match="no route .*/embeddings"):
        client.embeddings.create(model="m", input="x")
    answer = httpx.get(
        f"{trial['openai_base_url']}/chat/completions", headers={"Authorization": f"Bearer {trial['key']}"}
    )
    assert answer.status_code == 405 and "POST" in answer.headers["allow"]
    assert answer.json()["type"] == "error" and "GET is not allowed" in answer.json()["error"]["message"]
    claude = anthropic.Anthropic(base_url=trial["anthropic_base_url"], api_key=trial["key"], max_retries=0)
    with pytest.raises(anthropic.NotFoundError, match="no route .*/messages/batches"):
        claude.messages.batches.list()


#: a tool whose schema has a type no JSON Schema knows (OpenAI and Anthropic answer it 400).
NONSENSE = {"type": "object", "properties": {"command": {"type": "nonsense-type"}}}
OK_TOOL = {"name": "ok", "parameters": {"type": "object"}}
#: (route, body, the error's param or None (Anthropic has none), the start of its message)
BAD_SCHEMAS: list[tuple[str, dict[str, Any], str | None, str]] = [
    (
        "chat/completions",
        {
            "messages": USER,
            "tools": [{"type": "function", "function": f} for f in (OK_TOOL, {"name": "bash", "parameters": NONSENSE})],
        },
        "tools[1].function.parameters",
        "Invalid schema for function 'bash' (tools[1].function.parameters): "
        "In context=('properties', 'command'), 'type' 'nonsense-type'",
    ),
    (
        "responses",
        {
            "input": "x",
            "tools": [{"type": "function", **t} for t in (OK_TOOL, {"name": "bash", "parameters": NONSENSE})],
        },
        "tools[1].parameters",
        "Invalid schema for function 'bash' (tools[1].parameters): "
        "In context=('properties', 'command'), 'type' 'nonsense-type'",
    ),
    (
        "messages",
        {"messages": USER, "tools": [{"name": "ok", "input_schema": {}}, {"name": "bash", "input_schema": NONSENSE}]},
        None,
        "tools.1.custom.input_schema: JSON schema is invalid. It must match JSON Schema draft 2020-12",
    ),
]


@pytest.mark.parametrize(("route", "body", "param", "message"), BAD_SCHEMAS, ids=[r for r, *_ in BAD_SCHEMAS])
def test_an_invalid_tool_schema_is_the_format_s_400_naming_the_tool_and_the_problem(
    new_trial: Any, route: str, body: dict[str, Any], param: str | None, message: str
) -> None:
    trial = new_trial()
    headers = {"Authorization": f"Bearer {trial['key']}"}
    with httpx.Client(timeout=60) as http:
        answer = http.post(
            f"{trial['openai_base_url']}/{route}", json={"model": "m", "max_tokens": 4, **body}, headers=headers
        )
    assert answer.status_code == 400, answer.text
    error = answer.json()
    assert _shape_ok(route, error), error
    assert error["error"]["message"].startswith(message), error
    assert "bash" in error["error"]["message"] and "nonsense-type" in error["error"]["message"]
    if param is None:
        assert error == {
            "type": "error",
            "error": {"type": "invalid_request_error", "message": error["error"]["message"]},
        }
    else:
        assert error["error"] | {"message": ""} == {
            "message": "",
            "type": "invalid_request_error",
            "param": param,
            "code": "invalid_function_parameters",
        }
