"""The real openai SDK against the proxy on the built-in backend."""

from __future__ import annotations

import asyncio
import json
import time
from typing import Any

import httpx
import openai
import pytest

from farm.proxy.core import COUNT_EVERY_S
from tests.integration.proxy.conftest import BASH_TOOL, FINAL_TEXT, TOOL_WORD
from tests.metrics import scrape, value

pytestmark = pytest.mark.integration


def test_proxy_chat_completion_is_recorded_token_exact(new_trial: Any, api: httpx.Client, teacher: Any) -> None:
    trial = new_trial(sampling={"seed": 1})
    client = openai.OpenAI(base_url=trial["openai_base_url"], api_key=trial["key"])
    messages: list[Any] = [{"role": "system", "content": "You are terse."}, {"role": "user", "content": "hello"}]
    first = client.chat.completions.create(model="farm-tiny", messages=messages, max_tokens=12)
    messages += [first.choices[0].message.model_dump(exclude_none=True), {"role": "user", "content": "again"}]
    second = client.chat.completions.create(model="farm-tiny", messages=messages, max_tokens=12)
    assert second.usage is not None and first.usage is not None
    record = api.get(f"/v1/trials/{trial['id']}/record").json()
    assert [c["extends"] for c in record["certificate"]] == [None, 0]
    (segment,) = record["segment_tokens"]
    ids, mask, lps = segment["token_ids"], segment["loss_mask"], segment["logprobs"]
    assert len(ids) == second.usage.prompt_tokens + second.usage.completion_tokens
    assert sum(mask) == first.usage.completion_tokens + second.usage.completion_tokens
    recomputed = teacher(ids)
    for i, m in enumerate(mask):
        if m:
            assert abs(recomputed[i] - lps[i]) < 1e-4


def _record(api: httpx.Client, trial_id: str) -> dict[str, Any]:
    resp = api.get(f"/v1/trials/{trial_id}/record")
    assert resp.status_code == 200, resp.text
    return dict(resp.json())


def test_proxy_tool_call_round_trip_extends_the_record(
    new_trial: Any, api: httpx.Client, teacher: Any, tiny_tokenizer: Any
) -> None:
    # Given a model (scripted) that answers with a tool call, then with text
    trial = new_trial()
    client = openai.OpenAI(base_url=trial["openai_base_url"], api_key=trial["key"])
    messages: list[Any] = [{"role": "user", "content": f"{TOOL_WORD}: list the files"}]
    first = client.chat.completions.create(model="farm-tiny", messages=messages, tools=[BASH_TOOL])
    # Then the call comes back as an OpenAI tool call with arguments as JSON text
    choice = first.choices[0]
    assert choice.finish_reason == "tool_calls"
    (call,) = choice.message.tool_calls or []
    assert call.type == "function" and call.function.name == "bash"
    assert json.loads(call.function.arguments) == {"command": "ls -la"}
    assert choice.message.content == "Let me look."
    # When the harness answers the call and asks again
    messages += [
        choice.message.model_dump(exclude_none=True),
        {"role": "tool", "tool_call_id": call.id, "content": "a.txt\nb.txt"},
    ]
    second = client.chat.completions.create(model="farm-tiny", messages=messages, tools=[BASH_TOOL])
    assert second.choices[0].message.content == FINAL_TEXT
    # Then the second call extends the first: the sampled tool call is reused as ids, never re-rendered
    record = _record(api, trial["id"])
    assert [c["extends"] for c in record["certificate"]] == [None, 0]
    (segment,) = record["segment_tokens"]
    assert [span[0] for span in segment["spans"]] == ["prompt", "model", "env", "model"]
    ids, mask, lps = segment["token_ids"], segment["loss_mask"], segment["logprobs"]
    recomputed = teacher(ids)
    assert all(abs(recomputed[i] - lps[i]) < 1e-4 for i, m in enumerate(mask) if m)
    # And the stitched ids read as the template writes the whole conversation: the end of the turn
    # the model sampled after its call is not written a second time.
    whole = [*messages, {"role": "assistant", "content": FINAL_TEXT}]
    for message in whole:
        for tool_call in message.get("tool_calls") or []:
            tool_call["function"]["arguments"] = json.loads(tool_call["function"]["arguments"])
    rendered = tiny_tokenizer.apply_chat_template(whole, tools=[BASH_TOOL], tokenize=False)
    assert rendered.startswith(tiny_tokenizer.decode(ids, skip_special_tokens=False))


def test_proxy_stream_matches_the_record(new_trial: Any, api: httpx.Client) -> None:
    trial = new_trial(sampling={"seed": 7})
    client = openai.OpenAI(base_url=trial["openai_base_url"], api_key=trial["key"])
    stream = client.chat.completions.create(
        model="farm-tiny",
        messages=[{"role": "user", "content": "tell me a story"}],
        max_tokens=24,
        stream=True,
        stream_options={"include_usage": True},
    )
    chunks = list(stream)
    assert chunks[0].choices[0].delta.role == "assistant"
    assert chunks[-1].choices == [] and chunks[-1].usage is not None
    finishes = [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason]
    assert len(finishes) == 1
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    (entry,) = _record(api, trial["id"])["certificate"]
    assert entry["completion_tokens"] == chunks[-1].usage.completion_tokens
    assert text == _reply(api, trial["id"])["content"]


def test_proxy_stream_without_include_usage_sends_no_usage_chunk(new_trial: Any) -> None:
    trial = new_trial()
    client = openai.OpenAI(base_url=trial["openai_base_url"], api_key=trial["key"])
    chunks = list(
        client.chat.completions.create(
            model="farm-tiny", messages=[{"role": "user", "content": "hi"}], max_tokens=8, stream=True
        )
    )
    assert all(c.choices for c in chunks) and all(c.usage is None for c in chunks)


def _reply(api: httpx.Client, trial_id: str) -> dict[str, Any]:
    calls = api.get(f"/v1/trials/{trial_id}/calls").json()
    return dict(calls[-1]["reply"])


def test_proxy_edited_history_starts_a_new_segment(new_trial: Any, api: httpx.Client) -> None:
    trial = new_trial()
    client = openai.OpenAI(base_url=trial["openai_base_url"], api_key=trial["key"])
    messages: list[Any] = [{"role": "user", "content": "first question"}]
    first = client.chat.completions.create(model="farm-tiny", messages=messages, max_tokens=8)
    # The harness rewrites the model's answer before sending the history back (e.g. a summary).
    edited: Any = {"role": "assistant", "content": "something the model never wrote"}
    client.chat.completions.create(
        model="farm-tiny", messages=[*messages, edited, {"role": "user", "content": "next"}], max_tokens=8
    )
    assert first.choices[0].message.content is not None
    record = _record(api, trial["id"])
    first_entry, second_entry = record["certificate"]
    assert second_entry["extends"] is None and second_entry["segment"] == 1
    assert second_entry["diverged_at"] == 1 and "not the reply call 0 gave" in second_entry["reason"]
    assert [s["calls"] for s in record["segment_tokens"]] == [[0], [1]]


def test_proxy_async_client_and_concurrent_trials(new_trial: Any, api: httpx.Client) -> None:
    trials = [new_trial() for _ in range(4)]

    async def one(trial: dict[str, Any]) -> int:
        async with openai.AsyncOpenAI(base_url=trial["openai_base_url"], api_key=trial["key"]) as client:
            out = await client.chat.completions.create(
                model="farm-tiny", messages=[{"role": "user", "content": "count"}], max_tokens=6
            )
            assert out.usage is not None
            return out.usage.completion_tokens

    async def all_of_them() -> list[int]:
        return list(await asyncio.gather(*(one(t) for t in trials)))

    counts = asyncio.run(all_of_them())
    for trial, count in zip(trials, counts, strict=True):
        (entry,) = _record(api, trial["id"])["certificate"]
        assert entry["completion_tokens"] == count


def test_proxy_key_opens_only_its_own_trial(new_trial: Any) -> None:
    a, b = new_trial(), new_trial()
    client = openai.OpenAI(base_url=b["openai_base_url"], api_key=a["key"], max_retries=0)
    with pytest.raises(openai.AuthenticationError) as info:
        client.chat.completions.create(model="m", messages=[{"role": "user", "content": "x"}])
    assert "does not open trial" in str(info.value)
    nobody = openai.OpenAI(base_url=b["openai_base_url"].replace(b["id"], "no-such-trial"), api_key=a["key"])
    with pytest.raises(openai.AuthenticationError):
        nobody.models.list()


@pytest.mark.parametrize(
    ("body", "param"),
    [
        ({"n": 2}, "n"),
        ({"messages": []}, "messages"),
        ({"messages": [{"role": "wizard", "content": "x"}]}, "messages[0].role"),
        ({"tool_choice": "sometimes"}, "tool_choice"),
        ({"temperature": -1}, "temperature"),
        ({"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "x"}}]}]}, None),
    ],
)
def test_proxy_bad_request_is_a_400_naming_the_field(new_trial: Any, body: dict[str, Any], param: str | None) -> None:
    trial = new_trial()
    payload = {"model": "m", "messages": [{"role": "user", "content": "x"}], **body}
    resp = httpx.post(
        f"{trial['openai_base_url']}/chat/completions",
        json=payload,
        headers={"Authorization": f"Bearer {trial['key']}"},
    )
    assert resp.status_code == 400, resp.text
    error = resp.json()["error"]
    assert error["type"] == "invalid_request_error" and error["message"]
    if param is not None:
        assert param in (error["param"] or "") or param in error["message"]


@pytest.mark.parametrize(
    ("body", "param"),
    [({"max_tokens": 10**7}, "max_tokens"), ([], "body")],
    ids=["max_tokens past the limit", "a body that is no object"],
)
def test_proxy_names_exactly_the_parameter_to_fix(new_trial: Any, body: Any, param: str) -> None:
    trial = new_trial()
    if isinstance(body, dict):
        body = {"model": "m", "messages": [{"role": "user", "content": "x"}], **body}
    resp = httpx.post(
        f"{trial['openai_base_url']}/chat/completions", json=body, headers={"Authorization": f"Bearer {trial['key']}"}
    )
    assert resp.status_code == 400, resp.text
    error = resp.json()["error"]
    # Named as the field, and said in a line: not pydantic's multi-line dump of its model.
    assert error["param"] == param and error["message"].count("\n") == 0, error


def test_proxy_refused_call_leaves_nothing_in_the_record(new_trial: Any, api: httpx.Client) -> None:
    """A call refused before it reaches the backend (here, sampling parameters past their limit,
    streamed) leaves no pending call behind: ending the trial must not mark it incomplete."""
    trial = new_trial()
    body = {"model": "m", "messages": [{"role": "user", "content": "x"}], "max_tokens": 10**7, "stream": True}
    resp = httpx.post(
        f"{trial['openai_base_url']}/chat/completions", json=body, headers={"Authorization": f"Bearer {trial['key']}"}
    )
    assert resp.status_code == 400, resp.text
    assert api.post(f"/v1/trials/{trial['id']}/end").status_code == 200
    ended = api.get(f"/v1/trials/{trial['id']}").json()
    assert ended["incomplete"] is None and ended["calls"] == 0, ended


def test_proxy_context_overflow_is_openais_context_length_error(new_trial: Any) -> None:
    trial = new_trial()
    client = openai.OpenAI(base_url=trial["openai_base_url"], api_key=trial["key"], max_retries=0)
    with pytest.raises(openai.BadRequestError) as info:
        client.chat.completions.create(model="m", messages=[{"role": "user", "content": "word " * 3000}])
    assert info.value.code == "context_length_exceeded"


def test_proxy_ended_trial_refuses_calls(new_trial: Any, api: httpx.Client) -> None:
    trial = new_trial()
    assert api.post(f"/v1/trials/{trial['id']}/end").status_code == 200
    client = openai.OpenAI(base_url=trial["openai_base_url"], api_key=trial["key"], max_retries=0)
    with pytest.raises(openai.PermissionDeniedError):
        client.chat.completions.create(model="m", messages=[{"role": "user", "content": "x"}])


def test_proxy_stop_string_cuts_the_answer_and_the_record_keeps_what_was_sampled(
    new_trial: Any, api: httpx.Client
) -> None:
    trial = new_trial()
    client = openai.OpenAI(base_url=trial["openai_base_url"], api_key=trial["key"])
    out = client.chat.completions.create(
        model="m", messages=[{"role": "user", "content": f"{TOOL_WORD} go"}], tools=[BASH_TOOL], stop=["look"]
    )
    choice = out.choices[0]
    assert choice.message.content == "Let me " and choice.finish_reason == "stop" and not choice.message.tool_calls
    (call,) = api.get(f"/v1/trials/{trial['id']}/calls").json()
    assert call["reply"]["stop_string"] == "look"
    assert call["completion_tokens"] >= 2 and call["backend"]


def test_proxy_calls_are_counted_in_metrics(new_trial: Any, proxy_stack: Any) -> None:
    def ok_calls() -> float:
        return value(scrape(proxy_stack.settings.api_url, "e2e-token"), "farm_proxy_calls_total", outcome="ok")

    # A process sends its count at most COUNT_EVERY_S after a call: earlier tests' calls land first.
    time.sleep(COUNT_EVERY_S * 1.5)
    before = ok_calls()
    trial = new_trial()
    with openai.OpenAI(base_url=trial["openai_base_url"], api_key=trial["key"]) as client:
        for _ in range(2):
            client.chat.completions.create(
                model="farm-tiny", messages=[{"role": "user", "content": "hi"}], max_tokens=4
            )
    deadline = time.monotonic() + 10
    while ok_calls() < before + 2 and time.monotonic() < deadline:
        time.sleep(0.05)
    time.sleep(COUNT_EVERY_S * 1.5)  # and nothing more comes
    assert ok_calls() == before + 2
    # Each recorded call's latency, and the tokens its backend read and sampled, sent with the count.
    families = scrape(proxy_stack.settings.api_url, "e2e-token")
    assert value(families, "farm_proxy_call_seconds_count") >= 2
    assert value(families, "farm_proxy_call_seconds_sum") > 0
    backend = f"builtin@{proxy_stack.settings.worker.node}"
    assert value(families, "farm_backend_sampled_tokens_total", backend=backend) >= 2
    assert value(families, "farm_backend_prompt_tokens_total", backend=backend) > 0
