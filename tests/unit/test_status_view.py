"""``farm status`` as a reader sees it: reward, tokens/s and time left per running batch, tokens/s per
backend, and a backend past its capacity shown as jobs queued at it, not as an overload."""

from __future__ import annotations

import io
from datetime import UTC, datetime

from rich.console import Console

from farm.constants import BatchState, JobState, Outcome
from farm.schemas import BackendOut, BatchStatus, Health, Overview
from farm.status_view import batch_view, duration, jobs_on_backend, overview_view


def _text(renderable: object) -> str:
    console = Console(width=200, record=True, file=io.StringIO())
    console.print(renderable)
    return console.export_text()


def _batch(**fields: object) -> BatchStatus:
    base: dict[str, object] = {
        "id": 7,
        "state": BatchState.RUNNING,
        "created_at": datetime(2026, 1, 1, tzinfo=UTC),
        "finished_at": None,
        "group_size": 4,
        "total_jobs": 40,
        "finished_jobs": 10,
        "counts": {JobState.RUN: 30, JobState.DONE: 10},
        "outcomes": {Outcome.OK: 10},
        "metadata": {},
        "reward_mean": 0.4219,
        "scored": 10,
        "sampled_tokens": 12345,
        "tokens_per_s": 205.7,
        "elapsed_s": 60.0,
        "eta_s": 180.0,
    }
    return BatchStatus.model_validate({**base, **fields})


def _backend(inflight: int, capacity: int) -> BackendOut:
    return BackendOut(
        id="b0",
        url="http://b0",
        kind="vllm",
        model="m",
        capacity=capacity,
        inflight=inflight,
        healthy=True,
        weight_version=3,
        tokens_per_s=812.4,
    )


def test_status_shows_reward_pace_and_time_left_per_batch():
    overview = Overview(workers=[], queues=[], backends=[_backend(3, 16)], sandboxes={}, batches=[_batch()])
    text = _text(overview_view(Health(status="ok", checks={}, version="x"), overview, url="http://farm"))
    assert "0.42 (n=10)" in text and "206" in text and "3m00s" in text  # reward, tokens/s, time left
    assert "812" in text and "3 (16)" in text  # the backend's tokens/s and its jobs of its capacity
    assert "queued" not in text and "not a limit" not in text


def test_status_shows_a_backend_past_its_capacity_as_queued_not_overloaded():
    overview = Overview(workers=[], queues=[], backends=[_backend(20, 16)], sandboxes={}, batches=[])
    text = _text(overview_view(Health(status="ok", checks={}, version="x"), overview, url="http://farm"))
    assert "20 (16, 4 queued)" in text and "capacity is a share, not a limit" in text
    assert "20/16" not in text
    assert jobs_on_backend(16, 16).plain == "16 (16)"


def test_batch_view_reads_as_a_summary():
    text = _text(batch_view(_batch()))
    assert "0.42 (n=10)" in text and "12345 sampled tokens, 206 tokens/s" in text
    assert "running for 1m00s, about 3m00s left" in text
    finished = datetime(2026, 1, 1, 0, 5, tzinfo=UTC)
    done = _text(batch_view(_batch(state=BatchState.COMPLETE, finished_at=finished, eta_s=None)))
    assert "took 1m00s" in done and "left" not in done.split("time")[-1]


def test_duration_reads_at_every_scale():
    assert [duration(s) for s in (5, 65, 3 * 3600 + 20 * 60)] == ["5s", "1m05s", "3h20m"]
