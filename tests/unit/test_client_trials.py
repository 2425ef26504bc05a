"""Trials in the trainer's client (farm.client.trials), at the transport seam: the base URLs a
harness is given, which trial calls are sent again, and a trial record's segments as arrays."""

from __future__ import annotations

import asyncio
from typing import Any

import httpx
import numpy as np
import pytest

from farm.client import AsyncFarmClient, Conflict, FarmClient, InvalidSpec, decode_trajectory, to_arrays
from farm.client.arrays import NO_VERSION
from farm.client.retry import idempotent
from farm.db.arrays import encode_ids, encode_logprobs, encode_mask
from farm.schemas import TrialRecord
from tests.unit.test_client_retry import QUICK, Script, _fail

CREATED = {
    "id": "t1",
    "key": "fk-secret",
    "openai_base_url": "http://api:8700/proxy/t1/v1",
    "anthropic_base_url": "http://api:8700/proxy/t1",
}


def _trial(**extra: Any) -> dict[str, Any]:
    return {
        "id": "t1",
        "job_id": None,
        "model": "farm-tiny",
        "sampling": {},
        "history": "exact",
        "calls": 2,
        "segments": 1,
        "created_at": "2026-01-01T00:00:00Z",
        "ended_at": "2026-01-01T00:01:00Z",
        "incomplete": None,
        "metadata": {},
        "certificate": [{"seq": 0, "extends": None}, {"seq": 1, "extends": 0}],
        **extra,
    }


def _segment(ids: list[int], lps: list[float], mask: list[int], encoding: Any, versions: Any = ()) -> dict[str, Any]:
    def dump(value: Any) -> Any:
        return value if isinstance(value, list) else value.model_dump()

    return {
        "index": 0,
        "calls": [0, 1],
        "num_tokens": len(ids),
        "token_ids": dump(encode_ids(np.asarray(ids, "<i4").tobytes(), encoding)),
        "logprobs": dump(encode_logprobs(np.asarray(lps, "<f4").tobytes(), encoding)),
        "loss_mask": dump(encode_mask(np.asarray(mask, "u1").tobytes(), encoding)),
        "spans": [["prompt", 0, 2, 0], ["model", 2, 4, 0]],
        "weight_versions": list(versions),
    }


def _answer(body: Any, status: int = 200) -> Any:
    return lambda request: httpx.Response(status, json=body)


def test_a_trial_names_the_apis_proxy_unless_the_client_was_given_another():
    with Script([], _answer(CREATED, 201)).client() as client:
        assert client.create_trial().openai_base_url == "http://api:8700/proxy/t1/v1"
    script = Script([], _answer(CREATED, 201))
    transport = httpx.MockTransport(script)
    with FarmClient("http://farm", token="t", transport=transport, proxy_url="http://node3:8710/") as client:
        created = client.create_trial()
    assert created.openai_base_url == "http://node3:8710/proxy/t1/v1"
    assert created.anthropic_base_url == "http://node3:8710/proxy/t1"
    assert created.key == "fk-secret"

    async def main() -> Any:
        async with AsyncFarmClient(
            "http://farm", token="t", transport=httpx.MockTransport(script), proxy_url="http://node3:8710"
        ) as client:
            return await client.create_trial("t1")

    assert asyncio.run(main()).openai_base_url == "http://node3:8710/proxy/t1/v1"


def test_a_trial_the_api_would_refuse_is_refused_before_it_is_sent():
    script = Script([], _answer(CREATED, 201))
    with script.client() as client:
        with pytest.raises(InvalidSpec) as info:
            client.create_trial("no spaces allowed")
        assert info.value.field == "id"
        with pytest.raises(InvalidSpec):
            client.create_trial(sampling={"temperature": "hot"})
        with pytest.raises(InvalidSpec):
            client.create_trial(history="rewrite")  # type: ignore[arg-type]
    assert script.requests == []


@pytest.mark.parametrize("failure", [httpx.ReadError, httpx.RemoteProtocolError])
def test_a_create_that_may_have_reached_the_api_is_not_sent_again_even_with_an_id(failure):
    # Its answer holds the key, shown once: a second create could not give it back.
    for trial_id in (None, "t1"):
        script = Script([], _fail(failure))
        with script.client() as client, pytest.raises(failure):
            client.create_trial(trial_id)
        assert len(script.requests) == 1


def test_a_create_that_never_reached_the_api_is_sent_again():
    script = Script([_fail(httpx.ConnectError)], _answer(CREATED, 201))
    with script.client() as client:
        assert client.create_trial().id == "t1"
    assert len(script.requests) == 2


def test_a_conflicting_id_is_the_farms_conflict():
    script = Script([], _answer({"code": "conflict", "detail": "trial 't1' exists"}, 409))
    with script.client() as client, pytest.raises(Conflict):
        client.create_trial("t1")


def test_ending_and_reading_a_trial_are_sent_again_when_their_answer_is_lost():
    build = httpx.Client(base_url="http://farm").build_request
    assert idempotent(build("POST", "/v1/trials/t1/end"))
    assert not idempotent(build("POST", "/v1/trials"))
    assert not idempotent(build("DELETE", "/v1/trials/t1"))
    script = Script([_fail(httpx.ReadError)], _answer(_trial()))
    with script.client(QUICK) as client:
        assert client.end_trial("t1").ended_at is not None
    assert len(script.requests) == 2


@pytest.mark.parametrize("encoding", ["json", "b64"])
def test_a_trial_records_segments_are_rows_of_to_arrays(encoding):
    ids, lps, mask = [5, 6, 7, 8], [0.0, 0.0, -0.5, -1.5], [0, 0, 1, 1]
    body = _trial(encoding=encoding, segment_tokens=[_segment(ids, lps, mask, encoding, [[3, 2, 4]])])
    script = Script([], _answer(body))
    with script.client() as client:
        record = client.trial_record("t1", encoding=encoding)
    assert isinstance(record, TrialRecord) and [c["extends"] for c in record.certificate] == [None, 0]
    arrays = to_arrays(record.segment_tokens, versions=True, pad_side="left")
    assert arrays["input_ids"].tolist() == [ids]
    assert arrays["loss_mask"].tolist() == [mask]
    assert np.allclose(arrays["old_logprobs"], [lps])
    assert np.isnan(arrays["rewards"]).all()
    assert arrays["weight_versions"].tolist() == [[NO_VERSION, NO_VERSION, 3, 3]]


def test_a_segment_as_the_json_dict_decodes_as_its_model_does():
    segment = _segment([1, 2, 3], [0.0, -0.1, -0.2], [0, 1, 1], "json", [[1, 1, 3]])
    decoded = decode_trajectory(segment)
    assert decoded.token_ids.tolist() == [1, 2, 3] and decoded.reward is None
    assert list(decoded.weight_versions) == [(1, 1, 3)]
    two = to_arrays([segment, _segment([9], [0.0], [0], "json")])
    assert two["lengths"].tolist() == [3, 1]
