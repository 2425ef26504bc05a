"""A trainer of harness runs through the client library: ``FarmClient`` makes the trial, the real
openai SDK calls at the base URL it names (the API's proxy, or a ``farm proxy`` process given as
``proxy_url``), and the client reads the record back as arrays."""

from __future__ import annotations

import asyncio
from typing import Any

import numpy as np
import openai
import pytest

from farm.client import AsyncFarmClient, FarmClient, to_arrays
from farm.client.arrays import NO_VERSION
from farm.embedded import EmbeddedStack
from tests.integration.conftest import free_port
from tests.integration.proxy.conftest import BASH_TOOL, FINAL_TEXT, TOOL_WORD
from tests.integration.proxy.test_proxy_process import _start_proxy

pytestmark = pytest.mark.integration

TOKEN = "e2e-token"


def _episode(base_url: str, key: str) -> list[Any]:
    """A harness's episode: a tool call, its result, a final answer."""
    client = openai.OpenAI(base_url=base_url, api_key=key, max_retries=0)
    messages: list[Any] = [{"role": "user", "content": f"{TOOL_WORD}: list the files"}]
    first = client.chat.completions.create(model="farm-tiny", messages=messages, tools=[BASH_TOOL])
    (call,) = first.choices[0].message.tool_calls or []
    messages += [
        first.choices[0].message.model_dump(exclude_none=True),
        {"role": "tool", "tool_call_id": call.id, "content": "a.txt\nb.txt"},
    ]
    second = client.chat.completions.create(model="farm-tiny", messages=messages, tools=[BASH_TOOL])
    assert second.choices[0].message.content == FINAL_TEXT
    return [first, second]


def test_a_trainer_runs_a_harness_trial_and_reads_it_as_arrays(proxy_stack: EmbeddedStack, teacher: Any) -> None:
    # Given a trial made by the client, the harness pointed at the base URL it names
    with FarmClient(proxy_stack.settings.api_url, token=TOKEN) as farm:
        trial = farm.create_trial(sampling={"seed": 3}, metadata={"task": "ls"})
        assert trial.openai_base_url.startswith(proxy_stack.settings.api_url)
        replies = _episode(trial.openai_base_url, trial.key)
        # When the trainer ends it and reads its record
        ended = farm.end_trial(trial.id)
        assert ended.ended_at is not None and ended.calls == 2 and ended.metadata == {"task": "ls"}
        assert farm.end_trial(trial.id).ended_at == ended.ended_at  # ending twice is ending once
        record = farm.trial_record(trial.id)
    # Then the record is one segment, one row of arrays, whose model tokens the model sampled
    assert record.incomplete is None and [c["extends"] for c in record.certificate] == [None, 0]
    arrays = to_arrays(record.segment_tokens, versions=True)
    (row,) = arrays["input_ids"]
    mask = arrays["loss_mask"][0].astype(bool)
    assert int(arrays["lengths"][0]) == replies[1].usage.prompt_tokens + replies[1].usage.completion_tokens
    assert int(mask.sum()) == sum(r.usage.completion_tokens for r in replies)
    recomputed = np.asarray(teacher(row.tolist()), dtype=np.float32)
    assert np.allclose(arrays["old_logprobs"][0][mask], recomputed[mask], atol=1e-4)
    assert (arrays["weight_versions"][0][mask] != NO_VERSION).all()
    assert (arrays["weight_versions"][0][~mask] == NO_VERSION).all()
    assert np.isnan(arrays["rewards"]).all()


def test_the_async_client_names_a_farm_proxy_process_it_was_given(proxy_stack: EmbeddedStack) -> None:
    # Given a proxy process of its own, and an async client told of it
    port = free_port()
    _start_proxy(proxy_stack, port)  # the stack stops it with its other services
    proxy_url = f"http://127.0.0.1:{port}"

    async def make() -> Any:
        async with AsyncFarmClient(proxy_stack.settings.api_url, token=TOKEN, proxy_url=proxy_url) as farm:
            return await farm.create_trial(history="template")

    trial = asyncio.run(make())
    assert trial.openai_base_url == f"{proxy_url}/proxy/{trial.id}/v1"
    # When the harness's calls go to that process
    _episode(trial.openai_base_url, trial.key)

    async def read() -> Any:
        async with AsyncFarmClient(proxy_stack.settings.api_url, token=TOKEN) as farm:
            await farm.end_trial(trial.id)
            return await farm.trial_record(trial.id, encoding="json")

    record = asyncio.run(read())
    # Then the record holds them, as arrays a row per segment
    assert record.calls == 2 and record.history == "template"
    arrays = to_arrays(record.segment_tokens)
    assert len(arrays["input_ids"]) == record.segments
