"""A batch's history policy reaches every stage, and every segment of an episode is stored with its
trajectory and served back: packed in the row, read by EVAL's claim, and in the JSON, b64 and binary
results pages (on SQLite, and on PostgreSQL under the integration marker)."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import numpy as np
import pytest

from farm.api.binary import binary_page
from farm.client import to_arrays
from farm.client.binary import decode_page
from farm.constants import Stage
from farm.db import batches, reads
from farm.db.arrays import pack_segments, segment_data, unpack_segments
from farm.db.base import utcnow
from farm.db.jobs import attempts, claims, completions
from farm.db.models import Trajectory
from farm.db.session import transaction
from farm.schemas import BatchCreate, EvalResult, RunResult, SegmentData, TrajectoryData

LEASE_S = 30.0

#: odd lengths: a segment's arrays after a mask start unaligned in the packed value.
SEGMENTS = [
    SegmentData(token_ids=[1, 2, 3], logprobs=[0.0, -0.5, -0.25], loss_mask=[0, 1, 1], turn_offsets=[0, 1]),
    SegmentData(
        token_ids=[2**31 - 1, 4, 5, 6, 7],
        logprobs=[0.0, 0.0, -1.5, -0.125, 0.0],
        loss_mask=[0, 0, 1, 1, 0],
        turn_offsets=[0, 2, 4],
        weight_versions=[(3, 2, 4)],
    ),
]
MAIN = TrajectoryData(
    token_ids=[8, 9, 10, 11],
    logprobs=[0.0, 0.0, -0.75, -0.5],
    loss_mask=[0, 0, 1, 1],
    turn_offsets=[0, 2],
    weight_versions=[(4, 2, 4)],
    segments=SEGMENTS,
)


def test_pack_segments_round_trips_every_array_and_span():
    assert pack_segments([]) is None and unpack_segments(None) == []
    packed = pack_segments(SEGMENTS)
    assert packed is not None
    assert [segment_data(s) for s in unpack_segments(packed)] == SEGMENTS
    # Read from a view at an offset (as a page's buffer hands it over), the same.
    assert [segment_data(s) for s in unpack_segments(memoryview(b"xyz" + packed)[3:])] == SEGMENTS


def make_batch(sessions: Any, **options: Any) -> list[int]:
    request = BatchCreate(tasks=[{"type": "echo", "config": {"text": "t"}}], group_size=2, **options)
    with transaction(sessions) as s:
        now = utcnow()
        _, job_ids = batches.create_batch(
            s, request, idempotency_key=None, digest=batches.request_hash(request), now=now, owed_until=now
        )
    return list(job_ids)


def claim(sessions: Any, job_id: int, stage: Stage, *, now: Any = None, worker: str = "w1") -> claims.Claim:
    with transaction(sessions) as s:
        return claims.claim_stage(
            s.connection(),
            job_id=job_id,
            stage=stage,
            node="n1",
            worker=worker,
            now=now or utcnow(),
            lease_s=LEASE_S,
            max_attempts=3,
        )


def complete(sessions: Any, c: claims.Claim, output: completions.StageOutput) -> None:
    with transaction(sessions) as s:
        completions.complete_stage(
            s.connection(), c, output, worker="w1", now=utcnow(), owed_until=utcnow() + timedelta(seconds=LEASE_S)
        )


@pytest.mark.parametrize("history", ["exact", "template"])
def test_a_batchs_history_reaches_every_claim(sessions, history):
    job_id, other = make_batch(sessions, history=history)
    c = claim(sessions, job_id, Stage.INIT)  # the usual claim
    assert c.skip is None and c.history == history
    # A re-delivery after the lease lapsed takes the locked path, which reads the batch row itself.
    again = claim(sessions, job_id, Stage.INIT, now=utcnow() + timedelta(seconds=2 * LEASE_S), worker="w2")
    assert again.skip is None and again.attempt == 2 and again.history == history
    with sessions() as s:
        assert reads.batch_status(s, c.batch_id).history == history
    assert claim(sessions, other, Stage.INIT).history == history


def run_to_eval(sessions: Any, trajectory: TrajectoryData) -> claims.Claim:
    job_id, _ = make_batch(sessions)
    complete(sessions, claim(sessions, job_id, Stage.INIT), completions.StageOutput(init_state={}))
    run = claim(sessions, job_id, Stage.RUN)
    complete(sessions, run, completions.StageOutput(run_result=RunResult(trajectory=trajectory)))
    return claim(sessions, job_id, Stage.EVAL)


def test_every_segment_is_stored_with_the_trajectory_and_handed_to_eval(sessions):
    evaluation = run_to_eval(sessions, MAIN)
    assert evaluation.trajectory == MAIN
    complete(sessions, evaluation, completions.StageOutput(eval_result=EvalResult(reward=0.5)))
    with sessions() as s:
        for encoding in ("json", "b64"):
            out = reads.get_trajectory(s, evaluation.job_id, encoding)
            assert len(out.segments) == 2 and out.segments[1].weight_versions == [(3, 2, 4)]
            assert [seg.num_tokens for seg in out.segments] == [3, 5]
            assert [seg.turn_offsets for seg in out.segments] == [[0, 1], [0, 2, 4]]
            arrays = to_arrays([out], segments="all")
            assert arrays["lengths"].tolist() == [3, 5, 4]
            assert arrays["input_ids"][1].tolist() == SEGMENTS[1].token_ids
            assert arrays["rewards"].tolist() == [0.5, 0.5, 0.5]


def test_a_one_segment_trajectory_stores_no_segments(sessions):
    evaluation = run_to_eval(sessions, MAIN.model_copy(update={"segments": []}))
    assert evaluation.trajectory is not None and evaluation.trajectory.segments == []
    with sessions() as s:
        assert s.get_one(Trajectory, evaluation.job_id).segments is None


def test_results_pages_carry_every_segment_in_each_encoding(sessions):
    evaluation = run_to_eval(sessions, MAIN)
    complete(sessions, evaluation, completions.StageOutput(eval_result=EvalResult(reward=1.0)))
    with sessions() as s:
        rows = reads.results_rows(s, evaluation.batch_id, after=0, limit=10, trajectories=True)
        pages = {
            enc: reads.results_page(s, evaluation.batch_id, after=0, limit=10, encoding=enc, trajectories=True)
            for enc in ("json", "b64")
        }
    pieces = binary_page(rows, after=0)
    binary = decode_page(b"".join(pieces))
    (result,) = [r for r in binary.items if r.trajectory is not None]
    traj = result.trajectory
    assert traj is not None and traj.encoding == "binary" and len(traj.segments) == 2
    expected = to_arrays([t for t in [r.trajectory for r in pages["json"].items] if t], segments="all", versions=True)
    for page in (binary, pages["b64"]):
        got = to_arrays([t for t in [r.trajectory for r in page.items] if t], segments="all", versions=True)
        for key, value in expected.items():
            np.testing.assert_array_equal(got[key], value)
    assert expected["weight_versions"][1].tolist() == [-1, -1, 3, 3, -1]


def test_a_binary_page_without_segments_has_no_segments_key(sessions):
    evaluation = run_to_eval(sessions, MAIN.model_copy(update={"segments": []}))
    complete(sessions, evaluation, completions.StageOutput(eval_result=EvalResult(reward=1.0)))
    with sessions() as s:
        rows = reads.results_rows(s, evaluation.batch_id, after=0, limit=10, trajectories=True)
    pieces = binary_page(rows, after=0)
    assert b'"segments"' not in bytes(pieces[0])  # what older clients read, byte for byte as before
    (traj,) = [r.trajectory for r in decode_page(b"".join(pieces)).items if r.trajectory is not None]
    assert traj.segments == [] and to_arrays([traj], segments="all")["trajectory_index"].tolist() == [0]


def test_a_rerun_of_run_overwrites_the_segments_an_earlier_attempt_left(sessions):
    job_id, _ = make_batch(sessions)
    complete(sessions, claim(sessions, job_id, Stage.INIT), completions.StageOutput(init_state={}))
    run = claim(sessions, job_id, Stage.RUN)
    with transaction(sessions) as s:  # an earlier attempt's trajectory, of three segments
        attempts.save_trajectory(s.connection(), job_id, RunResult(trajectory=MAIN))
    complete(
        sessions,
        run,
        completions.StageOutput(run_result=RunResult(trajectory=TrajectoryData(**SEGMENTS[0].model_dump()))),
    )
    with sessions() as s:
        assert s.get_one(Trajectory, job_id).segments is None
