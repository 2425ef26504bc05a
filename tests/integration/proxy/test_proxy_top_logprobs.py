"""``logprobs`` + ``top_logprobs`` through the real openai SDK against the proxy on the built-in backend."""

from __future__ import annotations

from typing import Any

import httpx
import openai
import pytest

pytestmark = pytest.mark.integration

TOLERANCE = 1e-4


def _sampled(api: httpx.Client, trial_id: str) -> tuple[list[int], list[float], int]:
    """The record's one segment: its ids, and the logprobs and start of what the model sampled."""
    record = api.get(f"/v1/trials/{trial_id}/record").json()
    (segment,) = record["segment_tokens"]
    mask = segment["loss_mask"]
    start = mask.index(1)
    return segment["token_ids"], segment["logprobs"][start:], start


def _check(content: list[Any], k: int, api: httpx.Client, trial_id: str, teacher: Any) -> None:
    """Per sampled token: k entries, most likely first, the model's own top k values; the sampled
    token's logprob is the recorded one, at most the first entry's, and listed where its id is among
    the model's top k (texts may repeat across ids: ids are compared through the teacher)."""
    ids, recorded, start = _sampled(api, trial_id)
    want_top = teacher.top(ids, k)[start - 1 : -1]
    sampled = ids[start:]
    assert len(content) == len(recorded) == len(want_top)
    outside = 0
    for entry, lp, want, token_id in zip(content, recorded, want_top, sampled, strict=True):
        assert abs(entry.logprob - lp) <= 1e-6  # the record keeps float32
        assert entry.bytes == list(entry.token.encode())
        tops = entry.top_logprobs
        assert len(tops) == k
        values = [t.logprob for t in tops]
        assert values == sorted(values, reverse=True)
        assert max(abs(a - b) for a, b in zip(values, want.values(), strict=True)) <= TOLERANCE
        assert all(t.bytes == list(t.token.encode()) for t in tops)
        assert entry.logprob <= values[0] + TOLERANCE
        if token_id in want:
            assert any(t.token == entry.token and abs(t.logprob - entry.logprob) <= TOLERANCE for t in tops)
        else:
            outside += 1
            assert entry.logprob <= values[-1] + TOLERANCE
    assert outside < len(content)  # some sampled tokens are among the top k


def test_chat_top_logprobs_whole(new_trial: Any, api: httpx.Client, teacher: Any) -> None:
    trial = new_trial(sampling={"seed": 3})
    client = openai.OpenAI(base_url=trial["openai_base_url"], api_key=trial["key"])
    out = client.chat.completions.create(
        model="farm-tiny",
        messages=[{"role": "user", "content": "what are the top tokens?"}],
        max_tokens=16,
        logprobs=True,
        top_logprobs=5,
    )
    logprobs = out.choices[0].logprobs
    assert logprobs is not None and logprobs.content is not None
    _check(logprobs.content, 5, api, trial["id"], teacher)


def test_chat_top_logprobs_streamed(new_trial: Any, api: httpx.Client, teacher: Any) -> None:
    trial = new_trial(sampling={"seed": 5})
    client = openai.OpenAI(base_url=trial["openai_base_url"], api_key=trial["key"])
    chunks = list(
        client.chat.completions.create(
            model="farm-tiny",
            messages=[{"role": "user", "content": "stream the top tokens"}],
            max_tokens=16,
            logprobs=True,
            top_logprobs=3,
            stream=True,
            stream_options={"include_usage": True},
        )
    )
    carrying = [c.choices[0].logprobs.content for c in chunks if c.choices and c.choices[0].logprobs]
    content = [e for part in carrying for e in part or []]
    assert chunks[-1].usage is not None and len(content) == chunks[-1].usage.completion_tokens
    # The logprobs come with the content chunks as the tokens are decoded, not all at the end.
    assert sum(1 for part in carrying if part) > 1
    _check(content, 3, api, trial["id"], teacher)


def test_chat_logprobs_without_top_logprobs_lists_none(new_trial: Any) -> None:
    trial = new_trial()
    client = openai.OpenAI(base_url=trial["openai_base_url"], api_key=trial["key"])
    out = client.chat.completions.create(
        model="farm-tiny", messages=[{"role": "user", "content": "x"}], max_tokens=6, logprobs=True
    )
    content = out.choices[0].logprobs.content  # type: ignore[union-attr]
    assert content and all(e.top_logprobs == [] for e in content)


@pytest.mark.parametrize(
    ("body", "message"),
    [
        ({"logprobs": True, "top_logprobs": 21}, "Expected a value <= 20"),
        ({"logprobs": True, "top_logprobs": -1}, "Expected a value >= 0"),
        ({"logprobs": True, "top_logprobs": "3"}, "top_logprobs"),
        ({"top_logprobs": 2}, "only allowed when 'logprobs' is enabled"),
        ({"logprobs": False, "top_logprobs": 2}, "only allowed when 'logprobs' is enabled"),
    ],
)
def test_chat_bad_top_logprobs_is_a_400_naming_it(new_trial: Any, body: dict[str, Any], message: str) -> None:
    trial = new_trial()
    client = openai.OpenAI(base_url=trial["openai_base_url"], api_key=trial["key"], max_retries=0)
    with pytest.raises(openai.BadRequestError) as info:
        client.chat.completions.create(
            model="farm-tiny", messages=[{"role": "user", "content": "x"}], max_tokens=4, extra_body=body
        )
    assert info.value.param == "top_logprobs"
    assert message in info.value.message


def test_responses_top_logprobs_whole_and_streamed(new_trial: Any, api: httpx.Client, teacher: Any) -> None:
    trial = new_trial(sampling={"seed": 2})
    client = openai.OpenAI(base_url=trial["openai_base_url"], api_key=trial["key"])
    asked: Any = {"include": ["message.output_text.logprobs"], "top_logprobs": 4, "max_output_tokens": 12}
    whole = client.responses.create(model="farm-tiny", input="top tokens, please", **asked)
    (message,) = whole.output
    assert message.type == "message"
    part = message.content[0]
    assert part.type == "output_text" and part.logprobs is not None
    _check(part.logprobs, 4, api, trial["id"], teacher)

    other = new_trial(sampling={"seed": 2})
    streaming = openai.OpenAI(base_url=other["openai_base_url"], api_key=other["key"])
    with streaming.responses.stream(model="farm-tiny", input="top tokens, please", **asked) as stream:
        events = list(stream)
    done = [e for e in events if e.type == "response.output_text.done"]
    deltas = [e for e in events if e.type == "response.output_text.delta"]
    assert sum(1 for e in deltas if e.logprobs) > 1
    # The answer runs into max_output_tokens: the last event is response.incomplete, with the response.
    final = events[-1].response  # type: ignore[union-attr]
    streamed: Any = final.output[0].content[0]  # type: ignore[union-attr,index]
    assert streamed.logprobs is not None
    _check(streamed.logprobs, 4, api, other["id"], teacher)
    assert [len(e.logprobs) for e in done] == [len(streamed.logprobs)]
    # Without the include, no logprobs are computed or sent.
    plain = client.responses.create(model="farm-tiny", input="x", top_logprobs=4, max_output_tokens=4)
    assert plain.output[0].content[0].logprobs is None  # type: ignore[union-attr,index]
