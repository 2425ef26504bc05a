"""The real openai SDK's legacy ``client.completions`` against the proxy on the built-in backend."""

from __future__ import annotations

from typing import Any

import httpx
import numpy as np
import openai
import pytest

from farm.client import TrajectoryArrays, to_arrays
from tests.integration.proxy.conftest import TOOL_CALL_TEXT, TOOL_WORD

pytestmark = pytest.mark.integration

PROMPT = "Once upon a time, in a small village,"


def _client(trial: dict[str, Any]) -> openai.OpenAI:
    return openai.OpenAI(base_url=trial["openai_base_url"], api_key=trial["key"], max_retries=0)


def _record(api: httpx.Client, trial_id: str) -> dict[str, Any]:
    resp = api.get(f"/v1/trials/{trial_id}/record")
    assert resp.status_code == 200, resp.text
    return dict(resp.json())


def _calls(api: httpx.Client, trial_id: str) -> list[dict[str, Any]]:
    return list(api.get(f"/v1/trials/{trial_id}/calls").json())


def _ids(out: Any) -> tuple[list[int], list[int]]:
    """The prompt ids and sampled ids that vLLM's ``return_token_ids`` adds to the choice."""
    extra = out.choices[0].model_extra or {}
    return list(extra["prompt_token_ids"]), list(extra["token_ids"])


def test_completion_is_openais_shape_and_recorded_token_exact(new_trial: Any, api: httpx.Client, teacher: Any) -> None:
    trial = new_trial(sampling={"seed": 3})
    out = _client(trial).completions.create(
        model="farm-tiny", prompt=PROMPT, max_tokens=10, logprobs=1, extra_body={"return_token_ids": True}
    )
    assert out.id.startswith("cmpl-") and out.object == "text_completion" and out.model == "farm-tiny"
    (choice,) = out.choices
    assert choice.index == 0 and choice.finish_reason in ("stop", "length")
    assert out.usage is not None and out.usage.total_tokens == out.usage.prompt_tokens + out.usage.completion_tokens
    extra = choice.model_extra or {}
    prompt_ids, sampled = extra["prompt_token_ids"], extra["token_ids"]
    assert len(prompt_ids) == out.usage.prompt_tokens and len(sampled) == out.usage.completion_tokens
    # The legacy logprobs shape: one entry per token the text shows, offsets into the text.
    lp = choice.logprobs
    assert lp is not None and lp.tokens is not None and lp.token_logprobs is not None
    assert "".join(lp.tokens).startswith(choice.text) and lp.text_offset is not None and lp.text_offset[0] == 0
    # Each top_logprobs entry: the sampled token first, then the most likely (logprobs=1), as vLLM lists them.
    assert lp.top_logprobs is not None and len(lp.top_logprobs) == len(lp.tokens)
    for token, value, top in zip(lp.tokens, lp.token_logprobs, lp.top_logprobs, strict=True):
        assert next(iter(top.items())) == (token, value) and 1 <= len(top) <= 2 and max(top.values()) >= value
    # The record holds the prompt ids as tokenized, no template, and exactly the ids the backend sampled.
    record = _record(api, trial["id"])
    (entry,) = record["certificate"]
    assert entry["wire"] == "openai.completions" and entry["reason"] == "first call"
    (segment,) = record["segment_tokens"]
    assert segment["token_ids"] == prompt_ids + sampled
    assert segment["loss_mask"] == [0] * len(prompt_ids) + [1] * len(sampled)
    assert [s[0] for s in segment["spans"]] == ["prompt", "model"]
    assert segment["logprobs"][len(prompt_ids) : len(prompt_ids) + len(lp.token_logprobs)] == pytest.approx(
        lp.token_logprobs, abs=1e-6
    )
    # The most likely token's logprob is the model's (positions where a byte piece decodes to U+FFFD are
    # left out: several ids share that text, and the legacy shape keys entries by text).
    best = teacher.top(segment["token_ids"], 1)
    clear = [j for j, top in enumerate(lp.top_logprobs) if not any("\ufffd" in t for t in top)]
    assert clear
    for j in clear:
        (most_likely,) = best[len(prompt_ids) + j - 1].values()
        assert max(lp.top_logprobs[j].values()) == pytest.approx(most_likely, abs=1e-4)
    recomputed = teacher(segment["token_ids"])
    for i, m in enumerate(segment["loss_mask"]):
        if m:
            assert abs(recomputed[i] - segment["logprobs"][i]) < 1e-4


def test_text_prompt_that_extends_the_last_call_reuses_its_ids(new_trial: Any, api: httpx.Client) -> None:
    trial = new_trial(sampling={"seed": 5})
    client = _client(trial)
    first = client.completions.create(model="m", prompt=PROMPT, max_tokens=8, extra_body={"return_token_ids": True})
    assert first.choices[0].finish_reason == "length"  # no hidden end-of-text id: the text is all it sampled
    ids_first = sum(_ids(first), [])
    # The harness appends text of its own: only that is tokenized, the earlier ids are reused as they are.
    more = " and then"
    second = client.completions.create(
        model="m", prompt=PROMPT + first.choices[0].text + more, max_tokens=8, extra_body={"return_token_ids": True}
    )
    assert second.choices[0].finish_reason == "length"
    prompt2, sampled2 = _ids(second)
    assert prompt2[: len(ids_first)] == ids_first
    record = _record(api, trial["id"])
    second_entry = record["certificate"][1]
    assert second_entry["extends"] == 0 and second_entry["reused_tokens"] == len(ids_first)
    assert second_entry["template_tokens"] == len(prompt2) - len(ids_first) > 0
    (segment,) = record["segment_tokens"]
    assert segment["token_ids"] == prompt2 + sampled2
    assert [s[0] for s in segment["spans"]] == ["prompt", "model", "env", "model"]
    assert sum(segment["loss_mask"]) == first.usage.completion_tokens + second.usage.completion_tokens  # type: ignore[union-attr]
    # A prompt that is exactly the last one's prompt + reply continues it (finishing a cut-off answer).
    third = client.completions.create(model="m", prompt=PROMPT + first.choices[0].text + more + second.choices[0].text)
    assert third.usage is not None and third.usage.prompt_tokens == len(segment["token_ids"])
    assert _record(api, trial["id"])["certificate"][2]["extends"] == 1


def test_ids_prompt_extension_and_fork(new_trial: Any, api: httpx.Client) -> None:
    trial = new_trial(sampling={"seed": 9})
    client = _client(trial)
    start = [100, 11, 200, 5]
    first = client.completions.create(model="m", prompt=start, max_tokens=6, extra_body={"return_token_ids": True})
    _, sampled = _ids(first)
    # verl-style: the next prompt is the previous prompt ids + sampled ids + ids of its own.
    client.completions.create(model="m", prompt=[start + sampled + [198]], max_tokens=6)
    # A prompt whose ids do not start with them forks a new segment, and the certificate says why.
    client.completions.create(model="m", prompt=[start[0], 17, 18], max_tokens=4)
    record = _record(api, trial["id"])
    first_e, second_e, third_e = record["certificate"]
    assert second_e["extends"] == 0 and second_e["reused_tokens"] == len(start) + len(sampled)
    assert second_e["template_tokens"] == 1
    assert third_e["extends"] is None and third_e["compared_with"] == 1
    assert "do not start with call 1's prompt ids + sampled ids" in third_e["reason"]
    assert [s["calls"] for s in record["segment_tokens"]] == [[0, 1], [2]]


def test_text_prompt_that_does_not_extend_forks_with_a_reason(new_trial: Any, api: httpx.Client) -> None:
    trial = new_trial()
    client = _client(trial)
    first = client.completions.create(model="m", prompt=PROMPT, max_tokens=4)
    client.completions.create(model="m", prompt="A different story: " + first.choices[0].text, max_tokens=4)
    client.completions.create(model="m", prompt="A different story: " + first.choices[0].text, max_tokens=4)
    certificate = _record(api, trial["id"])["certificate"]
    assert certificate[1]["extends"] is None
    assert certificate[1]["reason"] == "the prompt does not extend call 0's prompt and reply (nor any earlier call's)"
    assert certificate[2]["reason"] == "repeats call 1's prompt (a retry, or another sample of it)"


def test_text_continuation_without_the_sampled_end_of_text_forks(new_trial: Any, api: httpx.Client) -> None:
    # The scripted answer ends on the end-of-turn id, which the text does not show: a prompt that
    # continues the text cannot reuse those ids without putting that id before the new text.
    trial = new_trial()
    client = _client(trial)
    prompt = f"{TOOL_WORD}: "
    first = client.completions.create(model="m", prompt=prompt, max_tokens=200)
    assert first.choices[0].text == TOOL_CALL_TEXT and first.choices[0].finish_reason == "stop"
    client.completions.create(model="m", prompt=prompt + first.choices[0].text + "\nok", max_tokens=4)
    second = _record(api, trial["id"])["certificate"][1]
    assert second["extends"] is None and second["compared_with"] == 0
    assert "continues call 0's reply without what the model sampled after it" in second["reason"]


def test_completion_stream_matches_the_record(new_trial: Any, api: httpx.Client) -> None:
    trial = new_trial(sampling={"seed": 11})
    chunks = list(
        _client(trial).completions.create(
            model="farm-tiny",
            prompt=PROMPT,
            max_tokens=12,
            stream=True,
            stream_options={"include_usage": True},
            logprobs=0,
        )
    )
    assert all(c.object == "text_completion" and c.id == chunks[0].id for c in chunks)
    assert chunks[-1].choices == [] and chunks[-1].usage is not None
    assert all(c.usage is None for c in chunks[:-1])
    finishes = [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason]
    assert len(finishes) == 1
    text = "".join(c.choices[0].text for c in chunks if c.choices)
    assert len([c for c in chunks if c.choices and c.choices[0].text]) > 1  # streamed as decoded, not in one piece
    (call,) = _calls(api, trial["id"])
    assert text == call["reply"]["content"]
    assert call["completion_tokens"] == chunks[-1].usage.completion_tokens
    (last,) = [c for c in chunks if c.choices and c.choices[0].finish_reason]
    assert last.choices[0].logprobs is not None and "".join(last.choices[0].logprobs.tokens or []).startswith(text)


def test_completion_stream_without_include_usage_and_with_echo(new_trial: Any) -> None:
    trial = new_trial()
    chunks = list(_client(trial).completions.create(model="m", prompt=PROMPT, max_tokens=6, stream=True, echo=True))
    assert all(c.choices and c.usage is None for c in chunks)
    assert chunks[0].choices[0].text == PROMPT
    whole = _client(trial).completions.create(model="m", prompt=PROMPT, max_tokens=6, echo=True)
    assert whole.choices[0].text.startswith(PROMPT) and len(whole.choices[0].text) > len(PROMPT)


def test_completion_record_to_arrays(new_trial: Any, api: httpx.Client) -> None:
    trial = new_trial(sampling={"seed": 2})
    client = _client(trial)
    first = client.completions.create(model="m", prompt=PROMPT, max_tokens=5)
    second = client.completions.create(model="m", prompt=PROMPT + first.choices[0].text + " then", max_tokens=5)
    (segment,) = _record(api, trial["id"])["segment_tokens"]
    trajectory = TrajectoryArrays(
        token_ids=np.asarray(segment["token_ids"], dtype=np.int32),
        logprobs=np.asarray(segment["logprobs"], dtype=np.float32),
        loss_mask=np.asarray(segment["loss_mask"], dtype=np.uint8),
        reward=1.0,
    )
    arrays = to_arrays([trajectory])
    assert arrays["input_ids"][0].tolist() == segment["token_ids"]
    # 1 on the ids the model sampled, 0 on the prompt and on the harness's added text.
    assert first.usage is not None and second.usage is not None
    model_spans = [(s[1], s[2]) for s in segment["spans"] if s[0] == "model"]
    assert [e - s for s, e in model_spans] == [first.usage.completion_tokens, second.usage.completion_tokens]
    expected = [0] * len(segment["token_ids"])
    for s, e in model_spans:
        expected[s:e] = [1] * (e - s)
    assert arrays["loss_mask"][0].tolist() == expected


@pytest.mark.parametrize(
    ("body", "param"),
    [
        ({"prompt": ["one", "two"]}, "prompt"),
        ({"prompt": [[1, 2], [3]]}, "prompt"),
        ({"prompt": []}, "prompt"),
        ({"prompt": ""}, "prompt"),
        ({"prompt": {"text": "x"}}, "prompt"),
        ({"prompt": [1, 10**9]}, "prompt"),
        ({"n": 2}, "n"),
        ({"best_of": 3}, "best_of"),
        ({"suffix": "end"}, "suffix"),
        ({"echo": True, "logprobs": 1}, "echo"),
        ({"max_tokens": 0}, "max_tokens"),
        ({"temperature": -1}, "temperature"),
    ],
)
def test_completion_bad_request_is_a_400_naming_the_field(new_trial: Any, body: dict[str, Any], param: str) -> None:
    trial = new_trial()
    resp = httpx.post(
        f"{trial['openai_base_url']}/completions",
        json={"model": "m", "prompt": "x", **body},
        headers={"Authorization": f"Bearer {trial['key']}"},
    )
    assert resp.status_code == 400, resp.text
    error = resp.json()["error"]
    assert error["type"] == "invalid_request_error" and error["message"]
    assert error["param"] == param


def test_completion_body_that_is_no_object_is_a_400_naming_the_body(new_trial: Any) -> None:
    trial = new_trial()
    resp = httpx.post(
        f"{trial['openai_base_url']}/completions", json=["x"], headers={"Authorization": f"Bearer {trial['key']}"}
    )
    assert resp.status_code == 400, resp.text
    assert resp.json()["error"]["param"] == "body"


def test_completion_errors_through_the_sdk(new_trial: Any, api: httpx.Client) -> None:
    trial = new_trial()
    client = _client(trial)
    with pytest.raises(openai.BadRequestError) as info:
        client.completions.create(model="m", prompt="word " * 3000)
    assert info.value.code == "context_length_exceeded" and info.value.param == "prompt"
    with pytest.raises(openai.BadRequestError) as info:
        client.completions.create(model="m", prompt=["a", "b"])
    assert info.value.param == "prompt"
    wrong = openai.OpenAI(base_url=trial["openai_base_url"], api_key="farm-trial-wrong", max_retries=0)
    with pytest.raises(openai.AuthenticationError):
        wrong.completions.create(model="m", prompt="x")
    assert api.post(f"/v1/trials/{trial['id']}/end").status_code == 200
    with pytest.raises(openai.PermissionDeniedError):
        client.completions.create(model="m", prompt="x")
