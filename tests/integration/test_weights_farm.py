"""Weight updates in a running farm: real API and workers, the built-in backend over HTTP decoding one
step per 20 ms, a batch in flight while the trainer pauses, loads and resumes.

What must hold in every mode: no rollout lost or duplicated, every sampled token stamped with the
version that sampled it, no turn recorded from an aborted request, and a transition an API died in
finished or rolled back by the next API."""

from __future__ import annotations

import os
import re
import signal
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import httpx
import numpy as np
import pytest
from sqlalchemy import update as sql_update

from farm.client import FarmClient, to_arrays
from farm.constants import JobState, Outcome
from farm.db.models import WeightUpdate
from farm.db.session import make_engine, make_session_factory, transaction
from farm.embedded import EmbeddedStack
from farm.errors import Conflict, InvalidSpec
from farm.llm.builtin.tiny import make_tiny
from tests.conftest import teacher_for
from tests.integration.conftest import scripted_stack
from tests.trajectories import lists, trajectories

pytestmark = [pytest.mark.integration, pytest.mark.timeout(300)]

#: ~310 tokens of the tiny model: ~6 s of decoding at 20 ms a step, so a pause lands mid-turn even on a
#: loaded machine.
LONG = "one two three four five six seven eight nine ten " * 10
SCRIPT = {"rules": [{"match": "say it long", "turns": [LONG]}]}


def long_job() -> dict:
    return {"type": "generate", "config": {"messages": [{"role": "user", "content": "say it long"}], "max_tokens": 500}}


@pytest.fixture(scope="module")
def stack(
    tmp_path_factory: pytest.TempPathFactory, module_pg_url: str, redis_url: str, tiny_model_dir: Path
) -> Iterator[EmbeddedStack]:
    with scripted_stack(
        tmp_path_factory.mktemp("weights-stack"),
        redis_url=redis_url,
        redis_offset=1,
        database_url=module_pg_url,
        model_dir=tiny_model_dir,
        node="weightsnode",
        rules=SCRIPT,
        builtin_step_time_ms=20.0,
        # The API finishes or rolls back an update within half a second of its deadline, not two.
        weight_redrive_interval_s=0.5,
    ) as stack:
        yield stack


@pytest.fixture
def farm(stack: EmbeddedStack) -> Iterator[FarmClient]:
    with FarmClient(stack.settings.api_url, token="e2e-token", timeout_s=120) as client:
        yield client
        # Each test leaves the farm serving, whatever it did.
        update = client.weights().update
        if update is not None and update.open:
            client.rollback(update.id)


@pytest.fixture(scope="module")
def other_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_tiny(tmp_path_factory.mktemp("seed1"), seed=1)


def decoded(stack: EmbeddedStack) -> int:
    text = httpx.get(f"{stack.builtin_url}/metrics").text
    found = re.search(r"^vllm:generation_tokens_total\S* (\S+)$", text, re.M)
    assert found is not None, "the backend's /metrics has no generation_tokens_total"
    return int(float(found.group(1)))


def wait_decoding(stack: EmbeddedStack, tokens: int) -> None:
    """Until the backend has decoded ``tokens`` more tokens (the batch's turns are mid-decode)."""
    start, deadline = decoded(stack), time.monotonic() + 60
    while decoded(stack) - start < tokens:
        assert time.monotonic() < deadline, "the batch never started decoding"
        time.sleep(0.05)


def finished(farm: FarmClient, batch_id: int) -> list:
    results = list(farm.results(batch_id, wait_s=10, encoding="json"))
    assert len({r.job.id for r in results}) == len(results), "a job was handed out twice"
    return results


def model_positions(t) -> list[int]:
    return [i for i, m in enumerate(t.loss_mask) if m]


def covered(t) -> list[int]:
    return [i for _, s, e in t.weight_versions for i in range(s, e)]


def test_keep_mode_update_mid_turn_stamps_each_token_with_its_version(stack, farm):
    batch = farm.submit([long_job()], group_size=3)
    wait_decoding(stack, 20)
    update = farm.pause(mode="keep")
    assert update.phase == "paused" and farm.weights().paused
    frozen = decoded(stack)
    time.sleep(0.3)
    assert decoded(stack) == frozen, "keep freezes the turns in flight"
    done = farm.resume(update.id, version=1)
    assert done.phase == "done" and not done.open and done.to_version == 1

    results = finished(farm, batch.id)
    assert [r.job.state for r in results] == [JobState.DONE] * 3
    for r in results:
        t = lists(r)
        assert covered(t) == model_positions(t), "the spans cover exactly the sampled tokens"
        assert [v for v, _, _ in t.weight_versions] == [0, 1], "started on version 0, ended on version 1"
    status = farm.weights()
    assert status.version == 1 and set(status.backends.values()) == {1} and not status.paused
    arrays = to_arrays(trajectories(results), versions=True)
    assert set(np.unique(arrays["weight_versions"])) == {-1, 0, 1}
    assert int(np.count_nonzero(np.asarray(arrays["weight_versions"]) >= 0)) == int(arrays["loss_mask"].sum())


def test_abort_mode_reissues_the_turn_on_the_new_weights(stack, farm, other_model, tmp_path):
    batch = farm.submit([long_job()], group_size=3)
    wait_decoding(stack, 20)
    update = farm.pause(mode="abort")
    update = farm.load_weights(update.id, path=other_model, version=5)
    assert update.phase == "loaded" and all(b.loaded_at is not None and b.version == 5 for b in update.backends)
    farm.resume(update.id)
    try:
        results = finished(farm, batch.id)
        new_teacher = teacher_for(other_model)
        for r in results:
            assert r.job.state is JobState.DONE and r.job.outcome is Outcome.OK
            t = lists(r)
            start = t.turn_offsets[1]
            # Only the re-issued turn is in the record, all of it sampled by the new weights.
            assert t.weight_versions == [(5, start, t.num_tokens)]
            assert t.info.get("aborted_turns") == 1
            want = new_teacher(t.token_ids)[start:]
            assert np.allclose(t.logprobs[start:], want, atol=1e-4)
    finally:
        update = farm.pause(mode="wait")
        farm.load_weights(update.id, path=stack.settings.llm.builtin_model_dir, version=6)
        farm.resume(update.id)


def test_wait_mode_finishes_turns_in_flight_and_holds_new_ones(stack, farm):
    first = farm.submit([long_job()], group_size=2)
    wait_decoding(stack, 10)
    version = farm.weights().version
    update = farm.pause(mode="wait")
    later = farm.submit([long_job()], group_size=2)
    time.sleep(1.0)
    assert farm.status(later.id).finished_jobs == 0, "turns wait while the farm is paused"
    farm.resume(update.id, version=version + 1)

    for r in finished(farm, first.id):
        assert {v for v, _, _ in lists(r).weight_versions} == {version}
    for r in finished(farm, later.id):
        assert {v for v, _, _ in lists(r).weight_versions} == {version + 1}


def test_max_staleness_marks_or_reruns_exactly_the_rollouts_past_it(stack, farm):
    marked = farm.submit([long_job()], group_size=2, max_staleness=0, on_stale="mark")
    rerun = farm.submit([long_job()], group_size=2, max_staleness=0, on_stale="rerun")
    wait_decoding(stack, 20)
    version = farm.weights().version
    update = farm.pause(mode="keep")
    farm.resume(update.id, version=version + 1)
    fresh = farm.submit([long_job()], max_staleness=0, on_stale="mark")

    for r in finished(farm, marked.id):
        assert r.job.stale and r.job.state is JobState.DONE
        assert lists(r).info["stale"] == {"oldest_version": version, "newest_version": version + 1}
    for r in finished(farm, rerun.id):
        assert not r.job.stale and r.job.attempts > 3, "re-run on the new weights"
        assert {v for v, _, _ in lists(r).weight_versions} == {version + 1}
    (r,) = finished(farm, fresh.id)
    assert not r.job.stale


def test_bad_weight_requests_are_refused_with_the_field(farm, stack):
    headers = {"Authorization": "Bearer e2e-token"}
    bad_mode = httpx.post(f"{stack.settings.api_url}/v1/weights/pause", json={"mode": "sideways"}, headers=headers)
    assert bad_mode.status_code == 422 and bad_mode.json()["field"] == "mode"
    update = farm.pause(mode="keep")
    with pytest.raises(Conflict):
        farm.pause(mode="keep")
    with pytest.raises(InvalidSpec) as old:
        farm.load_weights(update.id, path="/tmp", version=0)
    assert old.value.field == "version"
    with pytest.raises(InvalidSpec) as missing:
        farm.resume(update.id)
    assert missing.value.field == "version"
    farm.rollback(update.id)
    with pytest.raises(Conflict):
        farm.resume(update.id, version=3)


def _kill_api(stack: EmbeddedStack) -> None:
    api = next(s for s in stack.services if s.name == "api")
    os.killpg(api.process.pid, signal.SIGKILL)
    api.process.wait()
    stack.services.remove(api)


def _restart_api(stack: EmbeddedStack) -> None:
    stack.spawn("api", ["api"])
    _wait_for(lambda: stack._answers(f"{stack.settings.api_url}/readyz"), "the new API answers", timeout_s=60)


def _backend_paused(stack: EmbeddedStack) -> bool:
    return bool(httpx.get(f"{stack.builtin_url}/is_paused").json()["is_paused"])


def _wait_for(check: Callable[[], bool], what: str, timeout_s: float = 30) -> None:
    deadline = time.monotonic() + timeout_s
    while not check():
        assert time.monotonic() < deadline, what
        time.sleep(0.1)


def _phase(farm: FarmClient) -> str | None:
    update = farm.weights().update
    return update.phase if update is not None else None


def test_an_api_killed_mid_resume_is_finished_by_the_next_one(stack, farm):
    batch = farm.submit([long_job()], group_size=2)
    wait_decoding(stack, 10)
    version = farm.weights().version
    update = farm.pause(mode="keep")
    # The API dies after committing the resume, before telling the backends (what `resume` writes first).
    _kill_api(stack)
    engine = make_engine(stack.settings)
    try:
        with transaction(make_session_factory(engine)) as session:
            session.execute(
                sql_update(WeightUpdate)
                .where(WeightUpdate.id == update.id)
                .values(phase="resuming", to_version=version + 2)
            )
    finally:
        engine.dispose()
    assert _backend_paused(stack)
    _restart_api(stack)

    _wait_for(lambda: not _backend_paused(stack), "the new API resumed the backend")
    # It resumes the backends, then records the update done: the record may land a moment later.
    _wait_for(lambda: _phase(farm) == "done", "the new API recorded the update done")
    after = farm.weights()
    assert after.update is not None and after.update.phase == "done" and after.version == version + 2
    assert not after.paused
    results = finished(farm, batch.id)
    assert [r.job.state for r in results] == [JobState.DONE] * 2


def test_an_update_the_trainer_abandons_is_rolled_back(stack, farm):
    version = farm.weights().version
    update = farm.pause(mode="keep", timeout_s=2)
    _kill_api(stack)
    _restart_api(stack)
    batch = farm.submit([long_job()])

    _wait_for(lambda: not _backend_paused(stack), "the farm rolled the abandoned update back")
    after = farm.weights()
    assert after.update is not None and after.update.id == update.id and after.update.phase == "rolled_back"
    assert after.version == version and "deadline" in (after.update.error or "")
    (r,) = finished(farm, batch.id)
    assert r.job.state is JobState.DONE
