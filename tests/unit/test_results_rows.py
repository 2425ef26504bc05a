"""A results page as read from each database (PostgreSQL reads it in one statement, without the
ORM): the same jobs, the same trajectories, the same errors."""

from __future__ import annotations

from datetime import UTC, timedelta

import pytest
from sqlalchemy import insert, update

from farm.constants import BatchState, JobState, Outcome
from farm.db import batches, reads
from farm.db.arrays import pack_ids, pack_logprobs, pack_mask
from farm.db.base import utcnow
from farm.db.models import Batch, Job, Trajectory
from farm.db.session import transaction
from farm.errors import BatchNotFound
from farm.schemas import BatchCreate


def seed(sessions) -> tuple[int, list[int]]:
    """A running batch of four jobs: two done (with trajectories), one failed, one still queued.
    Returns the batch id and the finished jobs' ids in finish order."""
    request = BatchCreate(tasks=[{"type": "echo", "config": {"text": "x"}}] * 4)
    now = utcnow()
    with transaction(sessions) as session:
        batch, job_ids = batches.create_batch(
            session, request, idempotency_key=None, digest="rows", now=now, owed_until=now
        )
        finished = [job_ids[2], job_ids[0], job_ids[1]]
        for seq, job_id in enumerate(finished, start=1):
            done = seq < 3
            if done:
                session.execute(
                    insert(Trajectory).values(
                        job_id=job_id,
                        num_tokens=seq,
                        token_ids=pack_ids(list(range(seq))),
                        logprobs=pack_logprobs([-0.5] * seq),
                        loss_mask=pack_mask([1] * seq),
                        turn_offsets=pack_ids([0]),
                        reward=0.5 * seq,
                        metrics={"m": 1.0},
                        timings={},
                        info={"k": [1, 2]},
                        created_at=now,
                    )
                )
            session.execute(
                update(Job)
                .where(Job.id == job_id)
                .values(
                    state=JobState.DONE if done else JobState.FAILED,
                    outcome=Outcome.OK if done else Outcome.INFRA_ERROR,
                    reason=None if done else "lost",
                    reward=0.5 * seq if done else None,
                    finish_seq=seq,
                    node="n1",
                    finished_at=now + timedelta(seconds=seq),
                )
            )
        session.execute(update(Batch).where(Batch.id == batch.id).values(finished_jobs=3))
        return batch.id, finished


def test_results_rows_reads_finished_jobs_in_finish_order(sessions):
    batch_id, finished = seed(sessions)
    with sessions() as session:
        rows = reads.results_rows(session, batch_id, after=0, limit=10, trajectories=True)
        expected = [reads.job_out(session.get_one(Job, job_id), with_stages=False) for job_id in finished]
    assert (rows.state, rows.remaining) == (BatchState.RUNNING, 1)
    assert [seq for seq, _, _ in rows.items] == [1, 2, 3]
    assert [job for _, job, _ in rows.items] == expected
    assert all(job.finished_at is not None and job.finished_at.tzinfo == UTC for _, job, _ in rows.items)


def test_results_rows_carries_trajectories_of_done_jobs_only(sessions):
    batch_id, _ = seed(sessions)
    with sessions() as session:
        rows = reads.results_rows(session, batch_id, after=0, limit=10, trajectories=True)
    trajs = [traj for _, _, traj in rows.items]
    assert trajs[2] is None
    assert [bytes(t.token_ids) for t in trajs[:2]] == [pack_ids([0]), pack_ids([0, 1])]
    assert [(t.num_tokens, t.reward, t.metrics, t.info) for t in trajs[:2]] == [
        (1, 0.5, {"m": 1.0}, {"k": [1, 2]}),
        (2, 1.0, {"m": 1.0}, {"k": [1, 2]}),
    ]


def test_results_rows_without_trajectories_or_past_the_end(sessions):
    batch_id, finished = seed(sessions)
    with sessions() as session:
        bare = reads.results_rows(session, batch_id, after=1, limit=1, trajectories=False)
        past = reads.results_rows(session, batch_id, after=3, limit=10, trajectories=True)
    assert [(seq, job.id, traj) for seq, job, traj in bare.items] == [(2, finished[1], None)]
    assert (past.state, past.remaining, past.items) == (BatchState.RUNNING, 1, [])


def test_results_rows_of_a_missing_batch_raise(sessions):
    with sessions() as session, pytest.raises(BatchNotFound):
        reads.results_rows(session, 2**62, after=0, limit=10, trajectories=True)
