"""``farm proxy`` as a process of its own: it serves any trial, and a SIGKILL loses no answered call."""

from __future__ import annotations

import os
import signal
import threading
from typing import Any

import httpx
import openai
import psutil
import pytest

from farm.embedded import EmbeddedStack, Service
from tests.integration.conftest import free_port, wait_until
from tests.integration.proxy.conftest import SLOW_WORD

pytestmark = pytest.mark.integration


def _start_proxy(stack: EmbeddedStack, port: int, processes: int = 1) -> Service:
    service = stack.spawn(f"proxy-{port}", ["proxy", "--port", str(port), "--processes", str(processes)])

    def up() -> bool:
        try:
            return httpx.get(f"http://127.0.0.1:{port}/health", timeout=1).status_code == 200
        except httpx.HTTPError:
            return False

    wait_until(up, timeout_s=60, what="farm proxy")
    return service


def test_proxy_process_sigkilled_mid_call_loses_no_answered_call(
    proxy_stack: EmbeddedStack, new_trial: Any, api: httpx.Client
) -> None:
    # Given a trial served by a proxy process of its own, with one call answered
    port = free_port()
    service = _start_proxy(proxy_stack, port)
    trial = new_trial()
    base = f"http://127.0.0.1:{port}/proxy/{trial['id']}/v1"
    client = openai.OpenAI(base_url=base, api_key=trial["key"], max_retries=0)
    messages: list[Any] = [{"role": "user", "content": "go on"}]
    first = client.chat.completions.create(model="m", messages=messages, max_tokens=10)
    messages += [first.choices[0].message.model_dump(exclude_none=True), {"role": "user", "content": SLOW_WORD}]
    # When the process is SIGKILLed while the second call is generating (a long, scripted answer)
    errors: list[BaseException] = []

    def second() -> None:
        try:
            client.chat.completions.create(model="m", messages=messages, max_tokens=1500)
        except BaseException as exc:
            errors.append(exc)

    thread = threading.Thread(target=second)
    thread.start()
    calls = f"/v1/trials/{trial['id']}/calls"
    wait_until(lambda: len(api.get(calls).json()) == 2, timeout_s=30, what="the second call to start")
    os.killpg(service.process.pid, signal.SIGKILL)
    service.process.wait()
    thread.join(timeout=30)
    assert errors and isinstance(errors[0], openai.APIError)
    # And the harness retries the same request on another proxy process
    port2 = free_port()
    _start_proxy(proxy_stack, port2)
    retry = openai.OpenAI(base_url=base.replace(f":{port}/", f":{port2}/"), api_key=trial["key"], max_retries=0)
    retried = retry.chat.completions.create(model="m", messages=messages, max_tokens=10)
    assert api.post(f"/v1/trials/{trial['id']}/end").status_code == 200
    # Then every answer the harness received is in the record, and the retry extends the first call
    recorded = api.get(calls).json()
    assert [c["state"] for c in recorded] == ["done", "failed", "done"]
    assert recorded[0]["reply"]["content"] == first.choices[0].message.content
    assert recorded[2]["reply"]["content"] == retried.choices[0].message.content
    assert recorded[2]["extends"] == 0 and not recorded[2].get("branch")
    # And the killed call showed the harness nothing (it was not streamed): the record is whole
    assert api.get(f"/v1/trials/{trial['id']}").json()["incomplete"] is None


def test_proxy_processes_share_the_port_and_a_dead_one_is_replaced(
    proxy_stack: EmbeddedStack, new_trial: Any, api: httpx.Client
) -> None:
    # Given `farm proxy --processes 2`
    port = free_port()
    service = _start_proxy(proxy_stack, port, processes=2)
    supervisor = psutil.Process(service.process.pid)

    def servers() -> list[psutil.Process]:
        return [p for p in supervisor.children() if "resource_tracker" not in " ".join(p.cmdline())]

    wait_until(lambda: len(servers()) == 2, timeout_s=60, what="two serving processes")
    trial = new_trial()
    client = openai.OpenAI(base_url=f"http://127.0.0.1:{port}/proxy/{trial['id']}/v1", api_key=trial["key"])
    messages: list[Any] = [{"role": "user", "content": "go on"}]
    first = client.chat.completions.create(model="m", messages=messages, max_tokens=8)
    # When one of them dies
    victim = servers()[0]
    victim.kill()
    victim.wait(timeout=10)
    wait_until(lambda: len(servers()) == 2 and victim not in servers(), timeout_s=60, what="a replacement")
    # Then the port still answers, and the trial goes on where it was (state is not in a process)
    messages += [first.choices[0].message.model_dump(exclude_none=True), {"role": "user", "content": "more"}]
    for _ in range(4):
        client.chat.completions.create(model="m", messages=messages, max_tokens=8)
    recorded = api.get(f"/v1/trials/{trial['id']}/calls").json()
    assert [c["state"] for c in recorded] == ["done"] * 5
    assert recorded[1]["extends"] == 0


def test_proxy_retry_of_an_answered_call_is_a_branch(new_trial: Any, api: httpx.Client) -> None:
    trial = new_trial()
    client = openai.OpenAI(base_url=trial["openai_base_url"], api_key=trial["key"])
    messages: list[Any] = [{"role": "user", "content": "hello"}]
    first = client.chat.completions.create(model="m", messages=messages, max_tokens=6)
    messages += [first.choices[0].message.model_dump(exclude_none=True), {"role": "user", "content": "and?"}]
    client.chat.completions.create(model="m", messages=messages, max_tokens=6)
    client.chat.completions.create(model="m", messages=messages, max_tokens=6)
    calls = api.get(f"/v1/trials/{trial['id']}/calls").json()
    assert [(c["segment"], c["extends"], c.get("branch")) for c in calls] == [
        (0, None, None),
        (0, 0, None),
        (1, 0, True),
    ]
    record = api.get(f"/v1/trials/{trial['id']}/record").json()
    branch = record["segment_tokens"][1]
    # The branch carries the history it shares with segment 0, masked: those tokens train once.
    assert branch["calls"] == [2]
    assert sum(branch["loss_mask"]) == calls[2]["completion_tokens"]


def test_proxy_call_to_an_ended_trial_takes_no_backend_slot(
    proxy_stack: EmbeddedStack, new_trial: Any, api: httpx.Client
) -> None:
    import redis

    from farm.constants import llm_jobs_key, llm_leases_key, trial_balancer_key

    trial = new_trial()
    key = trial_balancer_key(trial["id"])
    client = openai.OpenAI(base_url=trial["openai_base_url"], api_key=trial["key"], max_retries=0)
    client.chat.completions.create(model="m", messages=[{"role": "user", "content": "hi"}], max_tokens=2)
    store = redis.Redis.from_url(proxy_stack.settings.redis_url)
    assert store.hget(llm_jobs_key(), key) is not None, "a trial holds its backend while it runs"
    assert api.post(f"/v1/trials/{trial['id']}/end").status_code == 200
    assert store.hget(llm_jobs_key(), key) is None
    # The proxy still trusts the key it checked a moment ago: the call is refused by the record.
    with pytest.raises(openai.APIStatusError) as refused:
        client.chat.completions.create(model="m", messages=[{"role": "user", "content": "again"}], max_tokens=2)
    assert refused.value.status_code == 403
    assert store.hget(llm_jobs_key(), key) is None and store.zscore(llm_leases_key(), key) is None
    store.close()
