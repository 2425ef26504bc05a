"""The LLM layer inside the farm: jobs that call a model through the balancer, end to end with
real workers, the built-in backend over HTTP (as vLLM is used), and backends that misbehave."""

from __future__ import annotations

import http.server
import re
import threading
from collections.abc import Callable, Iterator
from pathlib import Path

import numpy as np
import pytest

from farm.client import FarmClient, to_arrays
from farm.constants import JobState, Outcome
from farm.embedded import EmbeddedStack
from tests.integration.conftest import free_port, scripted_stack, side_redis_url, stack_settings, wait_until
from tests.metrics import scrape, value
from tests.trajectories import lists, trajectories, trajectory

pytestmark = [pytest.mark.integration, pytest.mark.timeout(300)]

QUESTION = [{"role": "user", "content": "What is two plus two?"}]
#: the stack's backend runs with this script: prompts marked "scripted:" get a fixed reply, the rest are sampled.
SCRIPT = {
    "rules": [
        {"match": "scripted: solve", "turns": ["Two plus two is \\boxed{4}."]},
        {"match": "scripted: fail", "turns": ["Two plus two is \\boxed{5}."]},
    ]
}


def generate(max_tokens: int = 12, **config) -> dict:
    return {"type": "generate", "config": {"messages": QUESTION, "max_tokens": max_tokens, **config}}


@pytest.fixture(scope="module")
def llm_stack(
    tmp_path_factory: pytest.TempPathFactory, module_pg_url: str, redis_url: str, tiny_model_dir: Path
) -> Iterator[EmbeddedStack]:
    with scripted_stack(
        tmp_path_factory.mktemp("llm-stack"),
        redis_url=redis_url,
        redis_offset=2,
        database_url=module_pg_url,
        model_dir=tiny_model_dir,
        node="llmnode",
        rules=SCRIPT,
    ) as stack:
        yield stack


@pytest.fixture
def llm_client(llm_stack: EmbeddedStack) -> Iterator[FarmClient]:
    with FarmClient(llm_stack.settings.api_url, token="e2e-token") as client:
        yield client


def test_generate_jobs_store_exactly_what_the_model_sampled(llm_client: FarmClient, teacher: Callable):
    batch = llm_client.submit([generate(16)], group_size=4, sampling={"temperature": 1.0, "seed": 5})
    results = list(llm_client.results(batch.id, wait_s=10, encoding="json"))

    assert len(results) == 4 and all(r.job.state is JobState.DONE and r.job.outcome is Outcome.OK for r in results)
    for r in results:
        t = lists(r)
        assert t.info["backend"].startswith("builtin@") and t.info["moves"] == []
        start = t.turn_offsets[1]  # the model's turn follows the rendered prompt
        assert t.loss_mask == [0] * start + [1] * (t.num_tokens - start), "loss mask is 1 exactly on sampled ids"
        recomputed = teacher(t.token_ids)
        sampled = np.array(t.logprobs[start:])
        assert np.allclose(sampled, recomputed[start:], atol=1e-4), "stored logprobs match a teacher-forced pass"
        assert all(lp == 0.0 for lp in t.logprobs[:start])
    # Four samples of one prompt at temperature 1 with per-job seeds: not all the same.
    assert len({tuple(lists(r).token_ids) for r in results}) > 1
    arrays = to_arrays(trajectories(results), pad_side="left")
    assert arrays["loss_mask"].sum() == sum(lists(r).num_tokens - lists(r).turn_offsets[1] for r in results)


def test_generate_with_a_scripted_reply_is_scored_and_token_exact(
    llm_client: FarmClient, tiny_tokenizer, teacher: Callable
):
    # Given the stack's backend scripted (LLMSettings.builtin_script) to solve one prompt and fail another
    tasks = [
        generate(
            64,
            messages=[{"role": "user", "content": f"scripted: {verdict} 2 + 2"}],
            reference="\\boxed{4}",
            match="contains",
        )
        for verdict in ("solve", "fail")
    ]

    # When both run through the farm
    batch = llm_client.submit(tasks, group_size=2, sampling={"temperature": 1.0})
    results = list(llm_client.results(batch.id, wait_s=10, encoding="json"))

    # Then the reply that holds the reference earns 1, the other 0, and the trajectories are exact
    assert len(results) == 4 and all(r.job.outcome is Outcome.OK for r in results)
    end = tiny_tokenizer.convert_tokens_to_ids("<|im_end|>")
    rewards = []
    for r in results:
        t = lists(r)
        start = t.turn_offsets[1]
        solved = "scripted: solve" in tiny_tokenizer.decode(t.token_ids[:start])
        reply = SCRIPT["rules"][0 if solved else 1]["turns"][0]
        assert t.token_ids[start:] == [*tiny_tokenizer.encode(reply, add_special_tokens=False), end]
        assert np.allclose(t.logprobs[start:], teacher(t.token_ids)[start:], atol=1e-4)
        assert r.job.reward == float(solved)
        rewards.append(r.job.reward)
    assert sorted(rewards) == [0.0, 0.0, 1.0, 1.0]


def test_generate_is_reproducible_for_a_seed(llm_client: FarmClient):
    def run() -> list[list[int]]:
        batch = llm_client.submit([generate(10)], group_size=2, sampling={"seed": 42})
        return sorted(lists(r).token_ids for r in llm_client.results(batch.id, wait_s=10, encoding="json"))

    assert run() == run()


def test_backends_api_adds_lists_and_removes(llm_client: FarmClient, llm_stack: EmbeddedStack):
    import httpx

    with httpx.Client(base_url=llm_stack.settings.api_url, headers={"Authorization": "Bearer e2e-token"}) as api:
        added = api.post("/v1/backends", json={"id": "spare", "url": "http://127.0.0.1:9/", "capacity": 4})
        assert added.status_code == 201 and added.json()["url"] == "http://127.0.0.1:9"
        ids = {b["id"] for b in api.get("/v1/backends").json()}
        assert {"spare", f"builtin@{llm_stack.settings.worker.node}"} <= ids
        assert api.get("/v1/backends/spare").json()["capacity"] == 4
        bad = api.post("/v1/backends", json={"url": "not a url"})
        assert bad.status_code == 422 and bad.json()["field"] == "url"
        assert api.delete("/v1/backends/spare").status_code == 204
        assert api.delete("/v1/backends/spare").status_code == 404
        assert api.get("/v1/backends/spare").json()["code"] == "not_found"


class _GarbageHandler(http.server.BaseHTTPRequestHandler):
    def do_POST(self) -> None:  # noqa: N802 - http.server's naming
        body = b"<html>this is not json</html>"
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    do_GET = do_POST  # noqa: N815

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture
def garbage_backend() -> Iterator[str]:
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _GarbageHandler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()
    server.server_close()


def _only_backend(stack: EmbeddedStack, **backend) -> None:
    import httpx

    with httpx.Client(base_url=stack.settings.api_url, headers={"Authorization": "Bearer e2e-token"}) as api:
        for b in api.get("/v1/backends").json():
            api.delete(f"/v1/backends/{b['id']}")
        assert api.post("/v1/backends", json=backend).status_code == 201


@pytest.fixture(scope="module")
def misbehaving_stack(
    tmp_path_factory: pytest.TempPathFactory, postgres_url: str, redis_url: str, tiny_model_dir: Path
) -> Iterator[EmbeddedStack]:
    """One farm for the misbehaving-backend cases, each of which replaces its backends: a database of
    its own (the backend registry lives there) and a Redis database of its own. Two attempts per stage
    and a one-second wait for a healthy backend (instead of 30) keep each case short. It serves no
    model: the wrong-model case points at the module's built-in backend."""
    import redis

    from farm.testing import temporary_database

    url = side_redis_url(redis_url, 1)
    redis.Redis.from_url(url).flushdb()
    with temporary_database(postgres_url, prefix="farm_mod", wait_for_disk=False) as database_url:
        settings = stack_settings(
            tmp_path_factory.mktemp("misbehaving-stack"),
            redis_url=url,
            database_url=database_url,
            model_dir=tiny_model_dir,  # the policy's tokenizer
            node="misbehavingnode",
        )
        settings = settings.model_copy(
            update={
                "worker": settings.worker.model_copy(update={"max_attempts": 2}),
                "llm": settings.llm.model_copy(update={"backend_wait_s": 1.0}),
            }
        )
        with EmbeddedStack(settings, with_flower=False, with_llm=False) as stack:
            yield stack
    redis.Redis.from_url(url).flushdb()


@pytest.mark.parametrize("case", ["no answer", "malformed json", "unknown model"])
def test_misbehaving_backend_fails_the_job_as_infrastructure(
    case: str, misbehaving_stack: EmbeddedStack, llm_stack: EmbeddedStack, garbage_backend: str
):
    # The module's farm for misbehaving backends, its only backend replaced by one that misbehaves.
    stack = misbehaving_stack
    if case == "no answer":
        _only_backend(stack, id="silent", url=f"http://127.0.0.1:{free_port()}")
    elif case == "malformed json":
        _only_backend(stack, id="garbage", url=garbage_backend)
    else:
        _only_backend(stack, id="wrong-model", url=llm_stack.builtin_url, kind="builtin", model="no-such-model")
    with FarmClient(stack.settings.api_url, token="e2e-token") as client:
        batch = client.submit([generate()])
        results = list(client.results(batch.id, wait_s=10))
    job = results[0].job
    assert job.state is JobState.FAILED and job.outcome is Outcome.INFRA_ERROR
    assert job.reward is None and results[0].trajectory is None, "an infrastructure failure is never a reward"
    expected = {"no answer": "LLM backend", "malformed json": "garbage", "unknown model": "no-such-model"}
    assert expected[case] in (job.reason or "")


def test_dead_backend_is_routed_around_and_the_move_recorded(llm_client: FarmClient, llm_stack: EmbeddedStack):
    import httpx

    with httpx.Client(base_url=llm_stack.settings.api_url, headers={"Authorization": "Bearer e2e-token"}) as api:
        # A backend that is registered but gone, as if its server died; it is chosen first (least
        # recently used), so the jobs that land on it must move to the live one.
        api.post("/v1/backends", json={"id": "dead", "url": f"http://127.0.0.1:{free_port()}", "capacity": 64})
        try:
            batch = llm_client.submit([generate(6)], group_size=4)
            results = list(llm_client.results(batch.id, wait_s=10))
        finally:
            api.delete("/v1/backends/dead")
    assert all(r.job.state is JobState.DONE for r in results)
    moves = [m for r in results for m in trajectory(r).info["moves"]]
    assert moves and all(m[0] == "dead" and m[1].startswith("builtin@") for m in moves)


def test_metrics_show_the_pipeline_an_operator_watches(llm_stack: EmbeddedStack, llm_client: FarmClient):
    batch = llm_client.submit([generate(8)], group_size=3, sampling={"seed": 2})
    assert len(list(llm_client.results(batch.id, wait_s=10, encoding="json"))) == 3

    families = scrape(llm_stack.settings.api_url, "e2e-token")

    kinds = {name: family.type for name, family in families.items()}
    assert kinds["farm_jobs"] == "gauge" and kinds["farm_jobs_finished"] == "counter"
    assert kinds["farm_stage_seconds"] == "histogram" and kinds["farm_queue_length"] == "gauge"
    # Every state is a series, zeros included; outcomes by task type.
    assert {s.labels["state"] for s in families["farm_jobs"].samples} == {s.value for s in JobState}
    assert value(families, "farm_jobs_finished_total", type="generate", outcome="ok") >= 3
    assert value(families, "farm_jobs_finished_total", type="generate", outcome="infra_error") >= 0
    # A histogram per stage of the task type, each job's stages counted once per recorded stage.
    for stage in ("init", "run", "eval"):
        count = value(families, "farm_stage_seconds_count", stage=stage, type="generate")
        assert (
            count >= 3
            and value(families, "farm_stage_seconds_bucket", stage=stage, type="generate", le="+Inf") == count
        )
    node = llm_stack.settings.worker.node
    queues = {s.labels["queue"]: s.labels for s in families["farm_queue_length"].samples}
    assert queues["init"]["stage"] == "init" and queues[f"run.{node}"]["node"] == node and f"eval.{node}" in queues
    backend = f"builtin@{node}"
    assert value(families, "farm_backend_capacity", backend=backend) > 0
    assert value(families, "farm_backend_inflight", backend=backend) == 0  # every job released its lease
    assert value(families, "farm_backend_up", backend=backend) == 1
    assert value(families, "farm_backend_prefix_cache_queries_total", backend=backend) > 0
    assert "farm_backend_prefix_cache_hits" in families and "farm_proxy_calls" in families
    # What an RL run is watched by: rewards, episodes and tokens by task type, tokens per backend.
    assert kinds["farm_reward"] == kinds["farm_episode_turns"] == kinds["farm_episode_tokens"] == "histogram"
    assert value(families, "farm_reward_count", type="generate") >= 3
    assert value(families, "farm_reward_bucket", type="generate", le="+Inf") >= 3
    assert value(families, "farm_episode_turns_sum", type="generate") >= value(
        families, "farm_episode_turns_count", type="generate"
    )  # a generate episode is one model turn
    assert value(families, "farm_episode_turns_bucket", type="generate", le="1") >= 3
    sampled = value(families, "farm_sampled_tokens_total", type="generate")
    assert sampled >= 3 and value(families, "farm_prompt_tokens_total", type="generate") >= 3
    assert value(families, "farm_episode_tokens_sum", type="generate") >= sampled
    assert value(families, "farm_backend_sampled_tokens_total", backend=backend) >= sampled
    assert value(families, "farm_backend_sampled_tokens_per_second", backend=backend) > 0
    assert kinds["farm_proxy_call_seconds"] == "histogram" and kinds["farm_batch_jobs_finished"] == "gauge"
    # The shipped dashboard asks only for series the farm serves (or declares: a histogram or a
    # running batch's figure has no sample until one is recorded).
    dashboard = (Path(__file__).parents[2] / "deploy" / "grafana-dashboard.json").read_text()
    served = {s.name for family in families.values() for s in family.samples}
    for name, family in families.items():
        suffixes = ("_bucket", "_sum", "_count") if family.type == "histogram" else ("_total", "")
        served |= {name + suffix for suffix in suffixes}
    asked = set(re.findall(r"\bfarm_[a-z_]+", dashboard)) - {"farm_"}
    assert asked and asked <= served, asked - served


def test_metrics_count_each_nodes_sandboxes(llm_stack: EmbeddedStack):
    # The workers' sweepers say it every interval; the figure is there without any job.
    node = llm_stack.settings.worker.node
    wait_until(
        lambda: any(
            s.labels == {"node": node}
            for s in scrape(llm_stack.settings.api_url, "e2e-token")["farm_sandboxes"].samples
        ),
        timeout_s=30,
        what="the node's sandbox count",
    )


def test_submit_fits_its_default_max_tokens_to_the_served_context(llm_stack: EmbeddedStack, llm_client: FarmClient):
    from farm.cli.batch import CONTEXT_SHARE, DEFAULT_MAX_TOKENS, _fitting_max_tokens

    (backend,) = [b for b in llm_client.overview().backends if b.kind == "builtin"]
    context = backend.context_tokens
    assert context is not None and context > 0  # the built-in backend's /v1/models max_model_len
    assert _fitting_max_tokens(llm_client) == min(DEFAULT_MAX_TOKENS, context // CONTEXT_SHARE)
