"""The ``harness`` task type end to end: real queues and workers, a bwrap sandbox with no network
but the proxy's socket, the built-in backend over HTTP, the record as the job's trajectory, and
the inner task's real grader."""

from __future__ import annotations

import json
import textwrap
from pathlib import Path
from typing import Any

import httpx
import pytest

from farm.client import FarmClient
from farm.embedded import EmbeddedStack
from farm.sandbox import sandbox_root
from farm.sandbox.registry import Registry
from tests.integration.conftest import scripted_stack
from tests.trajectories import lists

pytestmark = pytest.mark.integration

#: A harness of our own, run unmodified by the farm: two chat calls through OPENAI_BASE_URL with
#: the stdlib, a check that nothing but the proxy is reachable, and the task's file written.
HARNESS = textwrap.dedent(
    """
    import json, os, socket, urllib.request
    base, key = os.environ["OPENAI_BASE_URL"], os.environ["OPENAI_API_KEY"]

    def chat(messages):
        body = json.dumps({"model": "m", "messages": messages, "max_tokens": 8}).encode()
        req = urllib.request.Request(base + "/chat/completions", body, {
            "Authorization": "Bearer " + key, "Content-Type": "application/json"})
        return json.load(urllib.request.urlopen(req))["choices"][0]["message"]

    messages = [{"role": "user", "content": "write the file"}]
    reply = chat(messages)
    messages += [{"role": "assistant", "content": reply["content"]}, {"role": "user", "content": "done?"}]
    chat(messages)
    escaped = []
    for port in (5432, 6379):
        try:
            socket.create_connection(("127.0.0.1", port), timeout=2).close()
            escaped.append(port)
        except OSError:
            pass
    open("hello.txt", "w").write("Hello, farm!\\n" if not escaped else f"escaped to {escaped}\\n")
    """
)


@pytest.fixture(scope="module")
def harness_stack(
    tmp_path_factory: pytest.TempPathFactory, module_pg_url: str, redis_url: str, tiny_model_dir: Path
) -> Any:
    with scripted_stack(
        tmp_path_factory.mktemp("harness-stack"),
        redis_url=redis_url,
        redis_offset=0,
        database_url=module_pg_url,
        model_dir=tiny_model_dir,
        node="harnesstest",
        rules={"rules": []},
    ) as stack:
        yield stack


def test_harness_task_runs_an_external_harness_through_the_proxy(harness_stack: EmbeddedStack) -> None:
    config = {
        "task": {"type": "harbor", "config": {"example": "hello-file"}},
        "harness": {"preset": "command", "command": ["python3", "-c", HARNESS]},
    }
    with FarmClient(harness_stack.settings.api_url, token="e2e-token") as client:
        batch = client.submit([{"type": "harness", "config": config}], sampling={"temperature": 1.0})
        (result,) = list(client.results(batch.id, encoding="json"))
    job = result.job
    assert job.outcome == "ok", (job.reason, job)
    # The real grader saw the file the harness wrote, and the harness reached nothing but the proxy.
    assert job.reward == 1.0
    traj = lists(result)
    info = traj.info
    assert info["calls"] == 2 and info["segments"] == 1
    # The job's trajectory is the trial's record: two model turns, the second extending the first.
    with httpx.Client(base_url=harness_stack.settings.api_url, headers={"Authorization": "Bearer e2e-token"}) as api:
        record = api.get(f"/v1/trials/{info['trial']}/record").json()
    assert [c["extends"] for c in record["certificate"]] == [None, 0]
    assert record["segment_tokens"][0]["token_ids"] == traj.token_ids
    assert json.dumps(record["ended_at"]) != "null"
    # The batch's sampling overrode what the trainer set and nothing else: the harness's max_tokens held.
    assert record["sampling"] == {"temperature": 1.0}
    assert all(c["completion_tokens"] <= 8 for c in record["certificate"])


#: A harness that never finishes on its own: it calls the model again and again.
ENDLESS = textwrap.dedent(
    """
    import json, os, urllib.request
    base, key = os.environ["OPENAI_BASE_URL"], os.environ["OPENAI_API_KEY"]
    while True:
        body = json.dumps({"model": "m", "messages": [{"role": "user", "content": "more"}], "max_tokens": 300})
        req = urllib.request.Request(base + "/chat/completions", body.encode(), {
            "Authorization": "Bearer " + key, "Content-Type": "application/json"})
        urllib.request.urlopen(req).read()
    """
)


def test_a_cancelled_harness_job_stops_its_harness_and_leaves_nothing_running(harness_stack: EmbeddedStack) -> None:
    import re
    import time

    config = {
        "task": {"type": "harbor", "config": {"example": "hello-file"}},
        "harness": {"preset": "command", "command": ["python3", "-c", ENDLESS]},
    }
    headers = {"Authorization": "Bearer e2e-token"}
    with FarmClient(harness_stack.settings.api_url, token="e2e-token") as client:
        batch = client.submit([{"type": "harness", "config": config}])
        (job_id,) = batch.job_ids
        deadline = time.monotonic() + 60
        while client.job(job_id).state.value != "run" and time.monotonic() < deadline:
            time.sleep(0.2)
        time.sleep(2.0)  # the harness is calling the model
        client.cancel(batch.id)
        cancelled_at = time.monotonic()
        (result,) = list(client.results(batch.id))
        assert result.job.state.value == "cancelled"

    def running() -> int:
        text = httpx.get(f"{harness_stack.builtin_url}/metrics").text
        found = re.search(r"^vllm:num_requests_running\S* (\S+)$", text, re.M)
        assert found is not None
        return int(float(found.group(1)))

    # The worker sees the cancel (polled every 0.5 s) and the harness's sandbox goes; a loaded
    # machine may take a while, so the abort is timed from the sandbox's end, not the cancel's.
    registry = Registry(root=sandbox_root(harness_stack.settings))
    while registry.records() and time.monotonic() - cancelled_at < 60:
        time.sleep(0.1)
    assert registry.records() == [], "the cancelled job's sandbox (and its harness) is gone"
    gone_at = time.monotonic()
    # The proxy then aborts the call whose connection closed: under a second even loaded. Before
    # that abort, a whole (non-streamed) answer was decoded to its end for nobody.
    while running() and time.monotonic() - gone_at < 10:
        time.sleep(0.1)
    waited = (gone_at - cancelled_at, time.monotonic() - gone_at)
    assert running() == 0, f"the harness's model request was aborted with it (sandbox gone, then waited): {waited}"
    while time.monotonic() - cancelled_at < 15:
        backends = httpx.get(f"{harness_stack.settings.api_url}/v1/backends", headers=headers).json()
        if all(b["inflight"] == 0 for b in backends):
            break
        time.sleep(0.2)
    assert all(b["inflight"] == 0 for b in backends), "the trial's backend slot was released"
