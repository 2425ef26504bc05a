"""A batch's limits and quorum as rules: what a request may say (422s naming the field), the limits
a job keeps, and the one commit that makes a batch ready (its rest cut in it, never twice)."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest
from pydantic import ValidationError
from sqlalchemy import select, update
from sqlalchemy.orm import Session, sessionmaker

from farm.batches.submit import submit_batch, validate
from farm.config import Settings, WorkerSettings
from farm.constants import BatchState, JobState, Outcome, Stage
from farm.db.base import utcnow
from farm.db.batches import request_hash
from farm.db.models import Batch, Job
from farm.deadlines import ready
from farm.deadlines.limits import resolve
from farm.deadlines.shares import seconds_to
from farm.errors import InvalidSpec
from farm.schemas import BatchCreate, Quorum


def _request(tasks: int = 4, **extra: object) -> BatchCreate:
    return BatchCreate.model_validate(
        {"tasks": [{"type": "echo", "config": {"text": f"t{i}"}} for i in range(tasks)]} | extra
    )


@pytest.mark.parametrize(
    ("quorum", "says"),
    [
        ({"min_fraction": 0.5, "min_jobs": 2}, "give min_fraction or min_jobs, not both"),
        ({"rest": "carry"}, "give min_fraction, min_jobs or deadline_s"),
        ({"min_fraction": 1.5}, "less than or equal to 1"),
        ({"deadline_s": 0}, "greater than 0"),
        ({"min_jobs": 2, "rest": "later"}, "'cancel' or 'carry'"),
    ],
)
def test_quorum_refuses_what_it_cannot_mean(quorum: dict[str, object], says: str):
    with pytest.raises(ValidationError, match=says):
        _request(quorum=quorum)


@pytest.mark.parametrize("limits", [{"run_s": 0}, {"init_s": -1}, {"max_attempts": 0}, {"job_wall_s": 1e9}, {"x": 1}])
def test_limits_refuse_nonsense(limits: dict[str, object]):
    with pytest.raises(ValidationError):
        _request(limits=limits)


def test_submit_quorum_of_more_jobs_than_the_batch_names_min_jobs(settings: Settings):
    with pytest.raises(InvalidSpec) as caught:
        validate(_request(tasks=2, group_size=2, quorum={"min_jobs": 5}), settings)
    assert caught.value.field == "quorum.min_jobs"
    assert "min_jobs 5 is more than the batch's 4 jobs" in caught.value.message


def test_submit_quorum_on_a_dynamic_batch_is_refused(settings: Settings):
    request = _request(group_size=2, dynamic={"target_groups": 1}, quorum={"min_fraction": 0.5})
    with pytest.raises(InvalidSpec) as caught:
        validate(request, settings)
    assert caught.value.field == "quorum"


def test_request_hash_is_unchanged_by_limits_and_quorum_left_unset():
    # An idempotent resubmit across the upgrade must not be a conflict.
    assert request_hash(_request()) == request_hash(_request(limits=None, quorum=None))
    assert request_hash(_request()) != request_hash(_request(quorum={"min_jobs": 1}))


def test_quorum_needs_rounds_up():
    assert Quorum(min_fraction=0.95).needed(100) == 95
    assert Quorum(min_fraction=0.95).needed(512) == 487
    assert Quorum(min_jobs=600).needed(512) == 512
    assert Quorum(deadline_s=5).needed(7) == 7


def test_limits_are_the_batchs_where_it_set_them_and_name_which():
    limits = resolve(WorkerSettings(), {"run_s": 60, "max_attempts": 1})
    assert (limits.init_s, limits.run_s, limits.max_attempts) == (600.0, 60.0, 1)
    assert limits.named("run_s") == "limits.run_s=60" and limits.named("init_s") == "worker.init_timeout_s=600"
    now = utcnow()
    assert limits.allowance(Stage.RUN, init_at=now, now=now) == (60.0, "run_s")
    # The wall budget, what is left of it, shortens a stage whose own limit is longer.
    late = resolve(WorkerSettings(), {"job_wall_s": 100})
    allowed, which = late.allowance(Stage.RUN, init_at=now - timedelta(seconds=70), now=now)
    assert which == "job_wall_s" and allowed == pytest.approx(30.0)
    assert late.reason(Stage.EVAL, "job_wall_s") == "the job ran past its wall budget limits.job_wall_s=100s in eval"


def test_seconds_to_a_share_counts_the_share_of_the_whole_batch():
    t0 = utcnow()
    finished = [t0 + timedelta(seconds=s) for s in (1, 2, 3, 9)]
    assert seconds_to(t0, finished, 4) == {"50%": 2.0, "90%": 9.0, "99%": 9.0, "100%": 9.0}
    assert seconds_to(t0, finished, 10)["50%"] is None, "4 of 10 finished: not half yet"


def _submit(sessions: sessionmaker[Session], settings: Settings, **extra: Any) -> int:
    return submit_batch(sessions, settings, _request(**extra), key=None, send=lambda jobs: None).id


def _finish(sessions: sessionmaker[Session], batch_id: int, count: int) -> None:
    """``count`` jobs of the batch finished (as completions leave them: a place in the finish order)."""
    with sessions.begin() as s:
        ids = s.scalars(select(Job.id).where(Job.batch_id == batch_id).order_by(Job.id).limit(count)).all()
        for seq, job_id in enumerate(ids, start=1):
            s.execute(
                update(Job)
                .where(Job.id == job_id)
                .values(state=JobState.DONE, outcome=Outcome.OK, finish_seq=seq, finished_at=utcnow())
            )
        s.execute(update(Batch).where(Batch.id == batch_id).values(finished_jobs=count))


def _settle(sessions: sessionmaker[Session], batch_id: int) -> ready.Settled | None:
    with sessions.begin() as s:
        now = utcnow()
        return ready.settle(s.connection(), batch_id, now=now, teardown_due=now)


def test_settle_at_the_quorum_cuts_the_rest_in_the_same_commit_once(sessions, settings: Settings):
    batch_id = _submit(sessions, settings, quorum={"min_jobs": 3, "rest": "cancel"})
    _finish(sessions, batch_id, 2)
    assert _settle(sessions, batch_id) is None, "2 of the 3 needed"
    _finish(sessions, batch_id, 3)

    settled = _settle(sessions, batch_id)

    assert settled is not None and (settled.reason, settled.ready_seq, settled.rest) == ("quorum", 3, "cancel")
    with sessions() as s:
        batch = s.get_one(Batch, batch_id)
        assert batch.state is BatchState.COMPLETE and batch.ready_reason == "quorum" and batch.ready_seq == 3
        [cut] = s.scalars(select(Job).where(Job.batch_id == batch_id, Job.state == JobState.CANCELLED)).all()
        assert cut.finish_seq == 4 and cut.reason == "cut: the batch was ready at its quorum (3 of 4 jobs finished)"
    assert _settle(sessions, batch_id) is None, "ready once"


def test_settle_at_the_deadline_carries_the_rest(sessions, settings: Settings):
    batch_id = _submit(sessions, settings, quorum={"min_fraction": 0.9, "deadline_s": 30, "rest": "carry"})
    _finish(sessions, batch_id, 1)
    assert _settle(sessions, batch_id) is None, "before the deadline"
    with sessions.begin() as s:
        s.execute(update(Batch).where(Batch.id == batch_id).values(created_at=utcnow() - timedelta(seconds=31)))

    settled = _settle(sessions, batch_id)

    assert settled is not None and (settled.reason, settled.ready_seq, settled.revoke) == ("deadline", 1, [])
    with sessions() as s:
        assert s.get_one(Batch, batch_id).state is BatchState.RUNNING, "carried jobs keep the batch running"
        states = s.scalars(select(Job.state).where(Job.batch_id == batch_id)).all()
        assert sorted(states) == sorted([JobState.DONE, JobState.QUEUED, JobState.QUEUED, JobState.QUEUED])
    with sessions() as s:
        assert ready.unready(s.connection()) == [] or batch_id not in ready.unready(s.connection())
