"""The binary results page (``Accept: application/vnd.farm.results``) on real PostgreSQL: the same
jobs and arrays as the JSON page, its byte layout, and what other Accept values get."""

from __future__ import annotations

import json
import struct
from collections.abc import Iterator
from pathlib import Path

import httpx
import numpy as np
import pytest
from fastapi.testclient import TestClient
from sqlalchemy import insert, update

from farm.api.app import create_app
from farm.client import FarmClient, to_arrays
from farm.config import Settings
from farm.constants import BatchState, JobState, Outcome
from farm.db import batches
from farm.db.arrays import pack_ids, pack_logprobs, pack_mask
from farm.db.base import utcnow
from farm.db.models import Batch, Job, Trajectory
from farm.db.session import make_engine, make_session_factory, transaction
from farm.schemas import RESULTS_MEDIA_TYPE, BatchCreate, RawArray

pytestmark = pytest.mark.integration

TOKEN = "binary-test-token"
AUTH = {"Authorization": f"Bearer {TOKEN}"}
BINARY = {**AUTH, "Accept": RESULTS_MEDIA_TYPE}
#: token counts of the done jobs: odd lengths, so the arrays after a mask need padding to stay aligned.
LENGTHS = [7, 1, 13]


@pytest.fixture
def api(tmp_path: Path, pg_url: str, redis_url: str, redis_client: object) -> Iterator[TestClient]:
    settings = Settings(data_dir=tmp_path, database={"url": pg_url}, redis={"url": redis_url}, api={"token": TOKEN})
    with TestClient(create_app(settings)) as client:
        yield client


def forward(api: TestClient) -> httpx.MockTransport:
    """A transport that hands each request to the in-process app and its answer back as it came."""

    def handler(request: httpx.Request) -> httpx.Response:
        answer = api.request(request.method, request.url.path, params=request.url.params, headers=request.headers)
        return httpx.Response(answer.status_code, content=answer.content, headers=answer.headers)

    return httpx.MockTransport(handler)


@pytest.fixture
def farm(api: TestClient) -> Iterator[FarmClient]:
    with FarmClient("http://testserver", token=TOKEN, transport=forward(api)) as client:
        yield client


def seed(url: str, *, done: list[int], failed: int = 0, finished: bool = True) -> int:
    """A batch whose jobs finished in order: one trajectory per ``done`` length, then ``failed``
    failed jobs without one. Returns the batch id."""
    rng = np.random.default_rng(len(done))
    engine = make_engine(Settings(), url=url)
    now = utcnow()
    total = len(done) + failed + (0 if finished else 1)
    request = BatchCreate(tasks=[{"type": "echo", "config": {"text": "x"}}] * total)
    with transaction(make_session_factory(engine)) as session:
        batch, job_ids = batches.create_batch(
            session, request, idempotency_key=None, digest="binary", now=now, owed_until=now
        )
        for seq, job_id in enumerate(job_ids[: len(done) + failed], start=1):
            state, outcome = (JobState.DONE, Outcome.OK) if seq <= len(done) else (JobState.FAILED, Outcome.INFRA_ERROR)
            if state is JobState.DONE:
                n = done[seq - 1]
                mask = rng.integers(0, 2, n).astype(np.uint8)
                session.execute(
                    insert(Trajectory).values(
                        job_id=job_id,
                        num_tokens=n,
                        token_ids=pack_ids(rng.integers(0, 2**31 - 1, n)),
                        logprobs=pack_logprobs(-rng.random(n, dtype=np.float32) * mask),
                        loss_mask=pack_mask(mask),
                        turn_offsets=pack_ids([0, n // 2]),
                        reward=float(seq),
                        metrics={"m": 0.5},
                        timings={},
                        info={"k": [1, "two"]},
                        created_at=now,
                    )
                )
            session.execute(
                update(Job)
                .where(Job.id == job_id)
                .values(state=state, outcome=outcome, finish_seq=seq, finished_at=now, stage_done=True)
            )
        session.execute(
            update(Batch)
            .where(Batch.id == batch.id)
            .values(
                finished_jobs=len(done) + failed,
                state=BatchState.COMPLETE if finished else BatchState.RUNNING,
                finished_at=now if finished else None,
                enqueued_at=now,
            )
        )
        batch_id = batch.id
    engine.dispose()
    return batch_id


def unpack(body: bytes) -> tuple[dict, memoryview]:
    """The layout as a client in any language reads it: magic, header length, header, data."""
    assert body[:4] == b"FRP1"
    (length,) = struct.unpack_from("<I", body, 4)
    assert (8 + length) % 8 == 0
    return json.loads(body[8 : 8 + length]), memoryview(body)[8 + length :]


def test_results_binary_and_json_pages_give_the_same_jobs_and_arrays(farm: FarmClient, pg_url: str):
    batch_id = seed(pg_url, done=LENGTHS, failed=1)
    read = {enc: list(farm.results(batch_id, wait_s=0, page_size=2, encoding=enc)) for enc in ("binary", "b64", "json")}
    binary, b64, plain = read["binary"], read["b64"], read["json"]
    assert [r.seq for r in binary] == [r.seq for r in plain] == [1, 2, 3, 4]
    assert [r.job for r in binary] == [r.job for r in b64] == [r.job for r in plain]
    assert binary[-1].trajectory is None and binary[-1].job.state is JobState.FAILED
    trajs = {enc: [r.trajectory for r in results if r.trajectory] for enc, results in read.items()}
    assert all(isinstance(t.token_ids, RawArray) and t.encoding == "binary" for t in trajs["binary"])
    for name in ("num_tokens", "turn_offsets", "reward", "metrics", "timings", "info", "job_id", "group_id"):
        assert [getattr(t, name) for t in trajs["binary"]] == [getattr(t, name) for t in trajs["json"]]
    arrays = {enc: to_arrays(ts, pad_side="left") for enc, ts in trajs.items()}
    for key, value in arrays["json"].items():
        np.testing.assert_array_equal(arrays["binary"][key], value)
        np.testing.assert_array_equal(arrays["b64"][key], value)
    assert arrays["binary"]["lengths"].tolist() == LENGTHS


def test_results_binary_page_layout(api: TestClient, pg_url: str):
    batch_id = seed(pg_url, done=LENGTHS, failed=1)
    response = api.get(f"/v1/batches/{batch_id}/results", headers=BINARY)
    assert response.headers["content-type"] == RESULTS_MEDIA_TYPE and response.headers["vary"] == "Accept"
    header, data = unpack(response.content)
    page = api.get(f"/v1/batches/{batch_id}/results", params={"encoding": "json"}, headers=AUTH).json()
    assert {k: header[k] for k in ("next_cursor", "batch_state", "remaining", "finished")} == {
        k: page[k] for k in ("next_cursor", "batch_state", "remaining", "finished")
    }
    for ours, theirs in zip(header["items"], page["items"], strict=True):
        assert ours["job"] == theirs["job"] and ours["seq"] == theirs["seq"]
        if theirs["trajectory"] is None:
            assert ours["trajectory"] is None
            continue
        assert ours["trajectory"]["encoding"] == "binary"
        for name, dtype in (("token_ids", "<i4"), ("logprobs", "<f4"), ("loss_mask", "u1")):
            ref = ours["trajectory"][name]
            assert ref["offset"] % 8 == 0 and ref["length"] == theirs["trajectory"]["num_tokens"]
            values = np.frombuffer(data, dtype, count=ref["length"], offset=ref["offset"])
            assert values.tolist() == pytest.approx(theirs["trajectory"][name])


@pytest.mark.parametrize(
    ("accept", "binary"),
    [
        (None, False),
        ("*/*", False),
        ("application/json", False),
        ("text/html", False),
        ("application/*;q=1", False),
        ("nonsense;;;q=abc, ,", False),
        (f"{RESULTS_MEDIA_TYPE};q=0", False),
        (f"{RESULTS_MEDIA_TYPE};q=bad", False),
        (f"application/json, {RESULTS_MEDIA_TYPE};q=0.5", False),
        (RESULTS_MEDIA_TYPE, True),
        (RESULTS_MEDIA_TYPE.upper(), True),
        (f"application/json;q=0.5, {RESULTS_MEDIA_TYPE}", True),
        (f"text/html, {RESULTS_MEDIA_TYPE} ; q=0.2", True),
    ],
)
def test_results_accept_header_picks_binary_only_when_preferred(api: TestClient, pg_url: str, accept, binary):
    batch_id = seed(pg_url, done=[3])
    headers = AUTH if accept is None else {**AUTH, "Accept": accept}
    response = api.get(f"/v1/batches/{batch_id}/results", headers=headers)
    assert response.status_code == 200
    if binary:
        assert response.headers["content-type"] == RESULTS_MEDIA_TYPE
        assert unpack(response.content)[0]["items"][0]["trajectory"]["num_tokens"] == 3
    else:
        # Exactly the answer a client that sends no Accept gets.
        assert response.headers["content-type"] == "application/json"
        assert response.json() == api.get(f"/v1/batches/{batch_id}/results", headers=AUTH).json()


def test_results_binary_empty_page_of_a_running_batch(api: TestClient, farm: FarmClient, pg_url: str):
    batch_id = seed(pg_url, done=[], finished=False)
    response = api.get(f"/v1/batches/{batch_id}/results", params={"wait_s": 0}, headers=BINARY)
    header, data = unpack(response.content)
    assert header == {"items": [], "next_cursor": 0, "batch_state": "running", "remaining": 1, "finished": 0}
    assert len(data) == 0
    page = farm.results_page(batch_id, wait_s=0)
    assert page.items == [] and page.remaining == 1 and page.batch_state is BatchState.RUNNING


def test_results_binary_without_trajectories_or_past_the_end(api: TestClient, farm: FarmClient, pg_url: str):
    batch_id = seed(pg_url, done=[4, 5], failed=2)
    page = farm.results_page(batch_id, trajectories=False)
    assert [i.trajectory for i in page.items] == [None] * 4 and page.next_cursor == 4
    header, data = unpack(api.get(f"/v1/batches/{batch_id}/results?trajectories=false", headers=BINARY).content)
    assert len(header["items"]) == 4 and len(data) == 0
    assert farm.results_page(batch_id, after=4).items == []


def test_results_binary_of_a_failed_only_batch(farm: FarmClient, pg_url: str):
    batch_id = seed(pg_url, done=[], failed=3)
    results = list(farm.results(batch_id, wait_s=0, page_size=1))
    assert [(r.seq, r.trajectory) for r in results] == [(1, None), (2, None), (3, None)]


def test_results_binary_unknown_batch_is_a_json_404(api: TestClient):
    response = api.get("/v1/batches/987654321/results", headers=BINARY)
    assert response.status_code == 404 and response.json()["code"] == "not_found"


def test_results_client_reads_a_json_answer_to_a_binary_request(pg_url: str, api: TestClient):
    # A server that ignores Accept (an older farm) answers JSON: the client reads it as such.
    batch_id = seed(pg_url, done=[2])

    def handler(request: httpx.Request) -> httpx.Response:
        assert RESULTS_MEDIA_TYPE in request.headers["accept"] and request.url.params["encoding"] == "b64"
        answer = api.get(request.url.path, params=dict(request.url.params), headers=AUTH)
        return httpx.Response(200, content=answer.content, headers={"content-type": "application/json"})

    with FarmClient("http://farm", token=TOKEN, transport=httpx.MockTransport(handler)) as client:
        (result,) = client.results(batch_id, wait_s=0)
    assert result.trajectory is not None and result.trajectory.encoding == "b64"
