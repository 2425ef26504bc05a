"""OpenAI Responses through the real openai SDK against the proxy on the built-in backend."""

from __future__ import annotations

from typing import Any

import httpx
import openai
import pytest

from tests.integration.proxy.conftest import FINAL_TEXT, PARALLEL_WORD, TOOL_WORD

pytestmark = pytest.mark.integration

BASH: Any = {
    "type": "function",
    "name": "bash",
    "description": "Run a shell command",
    "parameters": {"type": "object", "properties": {"command": {"type": "string"}}, "required": ["command"]},
}


def test_responses_function_call_round_trip_extends_the_record(new_trial: Any, api: httpx.Client) -> None:
    trial = new_trial()
    client = openai.OpenAI(base_url=trial["openai_base_url"], api_key=trial["key"])
    items: list[Any] = [{"role": "user", "content": f"{TOOL_WORD}: list the files"}]
    first = client.responses.create(model="farm-tiny", instructions="be brief", input=items, tools=[BASH])
    message, call = first.output
    assert message.type == "message" and first.output_text == "Let me look."
    assert call.type == "function_call" and call.name == "bash" and call.arguments == '{"command": "ls -la"}'
    items += [item.model_dump(exclude_none=True) for item in first.output]
    items.append({"type": "function_call_output", "call_id": call.call_id, "output": "a.txt\nb.txt"})
    second = client.responses.create(model="farm-tiny", instructions="be brief", input=items, tools=[BASH])
    assert second.output_text == FINAL_TEXT and second.status == "completed"
    record = api.get(f"/v1/trials/{trial['id']}/record").json()
    assert [c["extends"] for c in record["certificate"]] == [None, 0]


def test_responses_repeat_the_request_s_tools_and_choices(new_trial: Any) -> None:
    trial = new_trial()
    client = openai.OpenAI(base_url=trial["openai_base_url"], api_key=trial["key"])
    asked: Any = {"tools": [BASH], "tool_choice": "required", "parallel_tool_calls": False}
    whole = client.responses.create(model="farm-tiny", input=f"{TOOL_WORD} now", **asked)
    with client.responses.stream(model="farm-tiny", input=f"{TOOL_WORD} now", **asked) as stream:
        created = next(e for e in stream if e.type == "response.created")
        final = stream.get_final_response()
    for response in (whole, created.response, final):
        assert response.parallel_tool_calls is False and response.tool_choice == "required"
        assert [t.name for t in response.tools] == ["bash"]  # type: ignore[union-attr]
    plain = client.responses.create(model="farm-tiny", input="hello", max_output_tokens=2)
    assert plain.parallel_tool_calls is True and plain.tool_choice == "auto" and plain.tools == []


def test_responses_stream_events_end_in_the_recorded_reply(new_trial: Any, api: httpx.Client) -> None:
    trial = new_trial()
    client = openai.OpenAI(base_url=trial["openai_base_url"], api_key=trial["key"])
    with client.responses.stream(model="farm-tiny", input=f"{TOOL_WORD} now", tools=[BASH]) as stream:
        kinds = [event.type for event in stream]
        final = stream.get_final_response()
    assert kinds[0] == "response.created" and kinds[-1] == "response.completed"
    assert "response.function_call_arguments.done" in kinds
    calls = api.get(f"/v1/trials/{trial['id']}/calls").json()
    assert final.output[-1].call_id == calls[-1]["reply"]["tool_calls"][0]["id"]  # type: ignore[union-attr]


def test_responses_streamed_items_sent_back_extend_the_record(new_trial: Any, api: httpx.Client) -> None:
    # Given a streamed answer whose text continues after a call (the "\n" between two calls): the
    # stream gives that text as a message item of its own, between the function calls
    trial = new_trial()
    client = openai.OpenAI(base_url=trial["openai_base_url"], api_key=trial["key"])
    items: list[Any] = [{"role": "user", "content": f"{PARALLEL_WORD}: look around"}]
    with client.responses.stream(model="farm-tiny", input=items, tools=[BASH]) as stream:
        for _ in stream:
            pass
        first = stream.get_final_response()
    assert [item.type for item in first.output] == ["message", "function_call", "message", "function_call"]
    # When the harness sends every item back with the calls' outputs
    items += [item.model_dump(exclude_none=True) for item in first.output]
    for item in first.output:
        if item.type == "function_call":
            items.append({"type": "function_call_output", "call_id": item.call_id, "output": "ok"})
    second = client.responses.create(model="farm-tiny", input=items, tools=[BASH])
    assert second.output_text == FINAL_TEXT
    # Then the items are one turn, the reply the model wrote: the second call extends the first
    record = api.get(f"/v1/trials/{trial['id']}/record").json()
    assert [c["extends"] for c in record["certificate"]] == [None, 0]


def test_responses_refuses_what_it_cannot_honour(new_trial: Any) -> None:
    trial = new_trial()
    client = openai.OpenAI(base_url=trial["openai_base_url"], api_key=trial["key"], max_retries=0)
    with pytest.raises(openai.BadRequestError, match="previous_response_id"):
        client.responses.create(model="m", input="x", previous_response_id="resp_1")
    # A built-in tool is not offered to the model, and does not fail the request.
    builtin: Any = [{"type": "web_search"}]
    out = client.responses.create(model="m", input="x", tools=builtin, max_output_tokens=4)
    assert out.usage is not None and out.usage.output_tokens >= 1
    with pytest.raises(openai.BadRequestError, match="needs a name"):
        nameless: Any = [{"type": "function"}]
        client.responses.create(model="m", input="x", tools=nameless)
