"""tool_choice required / named through the real SDKs: enforced by prefill, recorded as prompt.

The built-in backend's script writes the rest of the call after the opening the proxy forced, so
the model's part is deterministic; the opening itself is in the record as prompt ids (mask 0).
"""

from __future__ import annotations

import json
from typing import Any

import anthropic
import httpx
import openai
import pytest
from openai.types.chat import ChatCompletionMessageFunctionToolCall

from tests.integration.proxy.conftest import BASH_TOOL, FINAL_TEXT, NAMED_WORD, REQUIRED_WORD, UNMET_WORD

pytestmark = pytest.mark.integration

READ_TOOL: Any = {
    "type": "function",
    "function": {
        "name": "read_file",
        "description": "Read a file",
        "parameters": {"type": "object", "properties": {"path": {"type": "string"}}, "required": ["path"]},
    },
}
TOOLS = [BASH_TOOL, READ_TOOL]


def _record(api: httpx.Client, trial_id: str) -> dict[str, Any]:
    resp = api.get(f"/v1/trials/{trial_id}/record")
    assert resp.status_code == 200, resp.text
    return dict(resp.json())


def _spans(segment: dict[str, Any], kind: str) -> list[list[Any]]:
    return [span for span in segment["spans"] if span[0] == kind]


def test_proxy_required_tool_choice_forces_a_call_recorded_as_prompt(
    new_trial: Any, api: httpx.Client, teacher: Any
) -> None:
    # Given a harness that requires a call from one of two tools
    trial = new_trial()
    client = openai.OpenAI(base_url=trial["openai_base_url"], api_key=trial["key"])
    messages: list[Any] = [{"role": "user", "content": f"{REQUIRED_WORD}: list the files"}]
    first = client.chat.completions.create(model="farm-tiny", messages=messages, tools=TOOLS, tool_choice="required")
    # Then it gets a call: the forced opening and what the model wrote after it, parsed
    choice = first.choices[0]
    assert choice.finish_reason == "tool_calls" and choice.message.content is None
    (call,) = choice.message.tool_calls or []
    assert isinstance(call, ChatCompletionMessageFunctionToolCall)
    assert call.function.name == "bash" and json.loads(call.function.arguments) == {"command": "ls -la"}
    # And the record has the opening as prompt ids, masked 0, and the certificate says why
    (entry,) = _record(api, trial["id"])["certificate"]
    assert entry["forced_prefix_reason"] == "tool_choice=required" and entry["forced_prefix_tokens"] > 0
    assert "tool_choice_unmet" not in entry
    assert first.usage is not None and first.usage.completion_tokens == entry["completion_tokens"]
    # When the harness answers the call and asks again (tool_choice back to auto)
    messages += [
        choice.message.model_dump(exclude_none=True),
        {"role": "tool", "tool_call_id": call.id, "content": "a.txt\nb.txt"},
    ]
    second = client.chat.completions.create(model="farm-tiny", messages=messages, tools=TOOLS)
    assert second.choices[0].message.content == FINAL_TEXT
    # Then the second call extends the first exactly: one segment, the forced ids inside it
    record = _record(api, trial["id"])
    assert [c["extends"] for c in record["certificate"]] == [None, 0]
    assert "forced_prefix_tokens" not in record["certificate"][1]
    (segment,) = record["segment_tokens"]
    assert [span[0] for span in segment["spans"]] == ["prompt", "forced", "model", "env", "model"]
    ((_, start, end, seq),) = _spans(segment, "forced")
    assert seq == 0 and end - start == entry["forced_prefix_tokens"]
    mask, ids = segment["loss_mask"], segment["token_ids"]
    assert set(mask[start:end]) == {0}
    assert ids[start:end] == ids[:end][-entry["forced_prefix_tokens"] :]
    assert second.usage is not None and len(ids) == second.usage.prompt_tokens + second.usage.completion_tokens
    assert sum(mask) == entry["completion_tokens"] + second.usage.completion_tokens
    recomputed = teacher(ids)
    assert all(abs(recomputed[i] - segment["logprobs"][i]) < 1e-4 for i, m in enumerate(mask) if m)


def test_proxy_named_tool_choice_streams_the_call_name_first(new_trial: Any, api: httpx.Client) -> None:
    trial = new_trial()
    client = openai.OpenAI(base_url=trial["openai_base_url"], api_key=trial["key"])
    chunks = list(
        client.chat.completions.create(
            model="farm-tiny",
            messages=[{"role": "user", "content": f"{NAMED_WORD}: where am I"}],
            tools=TOOLS,
            tool_choice={"type": "function", "function": {"name": "bash"}},
            stream=True,
        )
    )
    deltas = [d for c in chunks if c.choices for d in c.choices[0].delta.tool_calls or []]
    head, *rest = deltas
    assert head.index == 0 and head.id and head.function is not None and head.function.name == "bash"
    assert all(d.index == 0 and d.id is None for d in rest)
    arguments = "".join(d.function.arguments or "" for d in deltas if d.function is not None)
    assert json.loads(arguments) == {"command": "pwd"}
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == ""
    assert [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason] == ["tool_calls"]
    (entry,) = _record(api, trial["id"])["certificate"]
    assert entry["forced_prefix_reason"] == "tool_choice=bash"


def test_proxy_unmet_tool_choice_is_what_the_model_wrote_and_marked(new_trial: Any, api: httpx.Client) -> None:
    # Given a model that does not complete the call the opening began
    trial = new_trial()
    client = openai.OpenAI(base_url=trial["openai_base_url"], api_key=trial["key"])
    messages: list[Any] = [{"role": "user", "content": f"{UNMET_WORD}: do something"}]
    first = client.chat.completions.create(model="farm-tiny", messages=messages, tools=TOOLS, tool_choice="required")
    # Then the harness gets the text as written (the forced opening included), not a made-up call
    choice = first.choices[0]
    assert choice.finish_reason == "stop" and not choice.message.tool_calls
    assert choice.message.content == '<tool_call>\n{"name": "I would rather talk.'
    (entry,) = _record(api, trial["id"])["certificate"]
    assert "did not complete a well-formed tool call" in entry["tool_choice_unmet"]
    # And sending that text back still extends the call exactly
    messages += [choice.message.model_dump(exclude_none=True), {"role": "user", "content": "fine"}]
    client.chat.completions.create(model="farm-tiny", messages=messages, tools=TOOLS)
    assert [c["extends"] for c in _record(api, trial["id"])["certificate"]] == [None, 0]


def test_anthropic_tool_choice_tool_forces_the_named_call(new_trial: Any, api: httpx.Client) -> None:
    trial = new_trial()
    client = anthropic.Anthropic(base_url=trial["anthropic_base_url"], api_key=trial["key"])
    tools: Any = [{"name": t["function"]["name"], "input_schema": t["function"]["parameters"]} for t in TOOLS]
    messages: list[Any] = [{"role": "user", "content": f"{NAMED_WORD}: where am I"}]
    with client.messages.stream(
        model="farm-tiny", max_tokens=128, messages=messages, tools=tools, tool_choice={"type": "tool", "name": "bash"}
    ) as stream:
        first = stream.get_final_message()
    assert first.stop_reason == "tool_use"
    (use,) = first.content
    assert use.type == "tool_use" and use.name == "bash" and use.input == {"command": "pwd"}
    messages += [
        {"role": "assistant", "content": [b.model_dump(exclude_none=True) for b in first.content]},
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": use.id, "content": "/work"}]},
    ]
    second = client.messages.create(model="farm-tiny", max_tokens=128, messages=messages, tools=tools)
    assert second.content[0].type == "text" and second.content[0].text == FINAL_TEXT
    record = _record(api, trial["id"])
    assert [c["extends"] for c in record["certificate"]] == [None, 0]
    assert record["certificate"][0]["forced_prefix_reason"] == "tool_choice=bash"
    assert len(record["segment_tokens"]) == 1


def test_anthropic_tool_choice_any_with_one_tool_forces_its_name(new_trial: Any, api: httpx.Client) -> None:
    trial = new_trial()
    client = anthropic.Anthropic(base_url=trial["anthropic_base_url"], api_key=trial["key"])
    bash: Any = {"name": "bash", "input_schema": BASH_TOOL["function"]["parameters"]}
    out = client.messages.create(
        model="farm-tiny",
        max_tokens=128,
        messages=[{"role": "user", "content": f"{NAMED_WORD}: where am I"}],
        tools=[bash],
        tool_choice={"type": "any"},
    )
    assert out.stop_reason == "tool_use" and out.content[-1].type == "tool_use"
    (entry,) = _record(api, trial["id"])["certificate"]
    assert entry["forced_prefix_reason"] == "tool_choice=required"


def test_responses_named_function_choice_forces_the_call(new_trial: Any, api: httpx.Client) -> None:
    trial = new_trial()
    client = openai.OpenAI(base_url=trial["openai_base_url"], api_key=trial["key"])
    tools: Any = [{"type": "function", **t["function"]} for t in TOOLS]
    out = client.responses.create(
        model="farm-tiny",
        input=f"{NAMED_WORD}: where am I",
        tools=tools,
        tool_choice={"type": "function", "name": "bash"},
    )
    (call,) = out.output
    assert call.type == "function_call" and call.name == "bash" and json.loads(call.arguments) == {"command": "pwd"}
    (entry,) = _record(api, trial["id"])["certificate"]
    assert entry["forced_prefix_reason"] == "tool_choice=bash"


def test_tool_choice_that_no_tool_can_meet_is_a_400_naming_it(new_trial: Any) -> None:
    trial = new_trial()
    oa = openai.OpenAI(base_url=trial["openai_base_url"], api_key=trial["key"], max_retries=0)
    user: Any = [{"role": "user", "content": "x"}]
    with pytest.raises(openai.BadRequestError) as info:
        oa.chat.completions.create(
            model="m", messages=user, tools=TOOLS, tool_choice={"type": "function", "function": {"name": "nope"}}
        )
    assert info.value.param == "tool_choice" and "'nope'" in info.value.message
    with pytest.raises(openai.BadRequestError) as info:
        oa.chat.completions.create(model="m", messages=user, tool_choice="required")
    assert info.value.param == "tool_choice"
    with pytest.raises(openai.BadRequestError, match="tool_choice"):
        oa.responses.create(model="m", input="x", tools=[], tool_choice={"type": "function", "name": "nope"})
    with pytest.raises(openai.BadRequestError, match="tool_choice"):
        oa.responses.create(model="m", input="x", tool_choice={"type": "web_search_preview"})
    an = anthropic.Anthropic(base_url=trial["anthropic_base_url"], api_key=trial["key"], max_retries=0)
    bash: Any = {"name": "bash", "input_schema": {"type": "object"}}
    with pytest.raises(anthropic.BadRequestError, match="tool_choice names 'nope'"):
        an.messages.create(
            model="m", max_tokens=4, messages=user, tools=[bash], tool_choice={"type": "tool", "name": "nope"}
        )
    # Anthropic has no "required": the message must not name the proxy's own term for its "any".
    with pytest.raises(anthropic.BadRequestError) as refused:
        an.messages.create(model="m", max_tokens=4, messages=user, tool_choice={"type": "any"})
    assert "no tools" in refused.value.message and "required" not in refused.value.message
