"""One tool call per answer when the harness refuses parallel calls (OpenAI's
``parallel_tool_calls: false``, Anthropic's ``disable_parallel_tool_use``): the generation stops
after the first call, and the next turn continues from exactly what the model sampled."""

from __future__ import annotations

import json
from typing import Any

import anthropic
import httpx
import openai
import pytest

from tests.integration.proxy.conftest import BASH_TOOL, FINAL_TEXT, PARALLEL_WORD

pytestmark = pytest.mark.integration

ASK = f"{PARALLEL_WORD}: look around"


def _first_model_span(api: httpx.Client, trial_id: str, tokenizer: Any) -> str:
    record = api.get(f"/v1/trials/{trial_id}/record").json()
    segment = record["segment_tokens"][0]
    _, start, end, _ = next(span for span in segment["spans"] if span[0] == "model")
    return str(tokenizer.decode(segment["token_ids"][start:end], skip_special_tokens=False))


def test_parallel_calls_are_all_given_by_default(new_trial: Any) -> None:
    trial = new_trial()
    client = openai.OpenAI(base_url=trial["openai_base_url"], api_key=trial["key"])
    out = client.chat.completions.create(
        model="farm-tiny", messages=[{"role": "user", "content": ASK}], tools=[BASH_TOOL]
    )
    given: Any = out.choices[0].message.tool_calls
    commands = [json.loads(c.function.arguments)["command"] for c in given]
    assert commands == ["ls -la", "cat notes.txt"]


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "streamed"])
def test_chat_without_parallel_calls_stops_after_the_first_and_continues_from_it(
    new_trial: Any, api: httpx.Client, teacher: Any, tiny_tokenizer: Any, stream: bool
) -> None:
    trial = new_trial()
    client = openai.OpenAI(base_url=trial["openai_base_url"], api_key=trial["key"])
    messages: list[Any] = [{"role": "user", "content": ASK}]
    asked: dict[str, Any] = {"model": "farm-tiny", "tools": [BASH_TOOL], "parallel_tool_calls": False}
    if stream:
        chunks = list(client.chat.completions.create(messages=messages, stream=True, **asked))
        deltas = [c.choices[0].delta for c in chunks if c.choices]
        calls = [call for d in deltas for call in d.tool_calls or [] if call.function and call.function.name]
        assert [call.index for call in calls] == [0], "one tool call is opened in the stream"
        finish = [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason]
        assert finish == ["tool_calls"]
        reply = api.get(f"/v1/trials/{trial['id']}/calls").json()[-1]["reply"]
        message: dict[str, Any] = {
            "role": "assistant",
            "content": reply["content"],
            "tool_calls": [
                {"id": c["id"], "type": "function", "function": {"name": c["name"], "arguments": c["arguments"]}}
                for c in reply["tool_calls"]
            ],
        }
    else:
        out = client.chat.completions.create(messages=messages, **asked)
        assert out.choices[0].finish_reason == "tool_calls"
        message = out.choices[0].message.model_dump(exclude_none=True)
    (call,) = message["tool_calls"]
    assert json.loads(call["function"]["arguments"]) == {"command": "ls -la"}
    # The generation was stopped at the call: the second one was never sampled.
    sampled = _first_model_span(api, trial["id"], tiny_tokenizer)
    assert sampled.startswith("Let me look.<tool_call>") and "notes.txt" not in sampled
    # The harness answers the one call; the next turn extends the record token-exact, with the
    # end of the turn the model did not write added by the template.
    messages += [message, {"role": "tool", "tool_call_id": call["id"], "content": "a.txt"}]
    second = client.chat.completions.create(messages=messages, **asked)
    assert second.choices[0].message.content == FINAL_TEXT
    record = api.get(f"/v1/trials/{trial['id']}/record").json()
    assert [c["extends"] for c in record["certificate"]] == [None, 0]
    (segment,) = record["segment_tokens"]
    ids, mask, lps = segment["token_ids"], segment["loss_mask"], segment["logprobs"]
    recomputed = teacher(ids)
    assert all(abs(recomputed[i] - lps[i]) < 1e-4 for i, m in enumerate(mask) if m)
    stitched = tiny_tokenizer.decode(ids, skip_special_tokens=False)
    assert f"{sampled}<|im_end|>\n<|im_start|>tool" in stitched


def test_anthropic_disable_parallel_tool_use_gives_one_tool_use(new_trial: Any, api: httpx.Client) -> None:
    trial = new_trial()
    client = anthropic.Anthropic(base_url=trial["anthropic_base_url"], api_key=trial["key"])
    tool: Any = {"name": "bash", "input_schema": BASH_TOOL["function"]["parameters"]}
    messages: Any = [{"role": "user", "content": ASK}]
    out = client.messages.create(
        model="farm-tiny",
        max_tokens=256,
        messages=messages,
        tools=[tool],
        tool_choice={"type": "auto", "disable_parallel_tool_use": True},
    )
    assert out.stop_reason == "tool_use"
    assert [b.input for b in out.content if b.type == "tool_use"] == [{"command": "ls -la"}]
    with pytest.raises(anthropic.BadRequestError, match="disable_parallel_tool_use"):
        client.messages.create(
            model="farm-tiny",
            max_tokens=16,
            messages=messages,
            tools=[tool],
            extra_body={"tool_choice": {"type": "auto", "disable_parallel_tool_use": "yes"}},
        )


def test_responses_without_parallel_calls_gives_one_function_call(new_trial: Any) -> None:
    trial = new_trial()
    client = openai.OpenAI(base_url=trial["openai_base_url"], api_key=trial["key"])
    tool: Any = {"type": "function", "name": "bash", "parameters": BASH_TOOL["function"]["parameters"]}
    out = client.responses.create(model="farm-tiny", input=ASK, tools=[tool], parallel_tool_calls=False)
    assert [item.arguments for item in out.output if item.type == "function_call"] == ['{"command": "ls -la"}']
    with pytest.raises(openai.BadRequestError, match="parallel_tool_calls"):
        client.chat.completions.create(
            model="farm-tiny",
            messages=[{"role": "user", "content": ASK}],
            tools=[BASH_TOOL],
            extra_body={"parallel_tool_calls": "no"},
        )
