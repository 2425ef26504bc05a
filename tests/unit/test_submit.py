"""Submitting a batch (``farm.batches.submit``): the farm's limits, INIT sent only after the commit,
and an idempotency key that answers with the same batch and sends again only what was never sent."""

from __future__ import annotations

import uuid

import pytest
from sqlalchemy import func, select
from sqlalchemy.orm import Session, sessionmaker

from farm.batches.submit import submit_batch
from farm.config import Settings
from farm.db.models import Batch, Job
from farm.errors import Conflict, HandlerNotFound, InvalidSpec
from farm.schemas import BatchCreate

Jobs = list[tuple[int, str | None]]


def _request(tasks: int = 2, group_size: int = 2, **extra: object) -> BatchCreate:
    return BatchCreate.model_validate(
        {"tasks": [{"type": "echo", "config": {"text": f"t{i}"}} for i in range(tasks)], "group_size": group_size}
        | extra
    )


class _Sender:
    """Records what was sent, and checks that the rows it names are committed when it is called."""

    def __init__(self, sessions: sessionmaker[Session], *, fail: bool = False) -> None:
        self.sessions, self.fail = sessions, fail
        self.sent: list[Jobs] = []

    def __call__(self, jobs: Jobs) -> None:
        with self.sessions() as other:  # another connection: sees only what was committed
            assert (other.scalar(select(func.count()).select_from(Job)) or 0) >= len(jobs)
        if self.fail:
            raise ConnectionError("the broker is away")
        self.sent.append(jobs)


def test_submit_sends_every_job_its_init_after_the_commit(sessions, settings: Settings):
    send = _Sender(sessions)
    out = submit_batch(sessions, settings, _request(), key=None, send=send)
    assert out.created is True
    assert [[job_id for job_id, _ in jobs] for jobs in send.sent] == [out.job_ids]
    assert len(out.job_ids) == 4
    with sessions() as s:
        assert s.get_one(Batch, out.id).enqueued_at is not None


def _key() -> str:
    return uuid.uuid4().hex  # the PostgreSQL database is shared by the module's tests


def test_submit_resubmit_with_the_key_answers_the_same_batch_and_sends_nothing(sessions, settings: Settings):
    send, key = _Sender(sessions), _key()
    first = submit_batch(sessions, settings, _request(), key=key, send=send)
    again = submit_batch(sessions, settings, _request(), key=key, send=send)
    assert (again.id, again.job_ids, again.created) == (first.id, first.job_ids, False)
    assert len(send.sent) == 1


def test_submit_resubmit_sends_again_when_the_first_send_failed(sessions, settings: Settings):
    # Given a batch committed whose send failed (the API crashed between the two)
    key = _key()
    with pytest.raises(ConnectionError):
        submit_batch(sessions, settings, _request(), key=key, send=_Sender(sessions, fail=True))
    # When the trainer resubmits with the same key, then the same jobs are sent
    send = _Sender(sessions)
    out = submit_batch(sessions, settings, _request(), key=key, send=send)
    assert out.created is False
    assert [[job_id for job_id, _ in jobs] for jobs in send.sent] == [out.job_ids]


def test_submit_key_reused_for_another_body_is_a_conflict(sessions, settings: Settings):
    key = _key()
    submit_batch(sessions, settings, _request(), key=key, send=_Sender(sessions))
    with pytest.raises(Conflict):
        submit_batch(sessions, settings, _request(group_size=3), key=key, send=_Sender(sessions))


def test_submit_over_the_task_limit_writes_nothing(sessions, settings: Settings):
    settings.api.max_tasks_per_batch = 1
    with sessions() as s:
        before = s.scalar(select(func.count()).select_from(Batch))
    with pytest.raises(InvalidSpec) as caught:
        submit_batch(sessions, settings, _request(), key=None, send=_Sender(sessions))
    assert caught.value.field == "tasks"
    with sessions() as s:
        assert s.scalar(select(func.count()).select_from(Batch)) == before


def test_submit_over_the_job_limit_names_group_size_unless_dynamic(sessions, settings: Settings):
    settings.api.max_jobs_per_batch = 3
    with pytest.raises(InvalidSpec) as caught:
        submit_batch(sessions, settings, _request(), key=None, send=_Sender(sessions))
    assert caught.value.field == "group_size"
    # A dynamic batch runs a few groups at a time: its pool is not bounded by the job limit.
    dynamic = _request(dynamic={"target_groups": 1, "filter": "std"})
    assert submit_batch(sessions, settings, dynamic, key=None, send=_Sender(sessions)).created


def test_submit_names_the_task_whose_type_is_unknown(sessions, settings: Settings):
    request = BatchCreate.model_validate(
        {"tasks": [{"type": "echo", "config": {"text": "x"}}, {"type": "no-such-handler"}]}
    )
    with pytest.raises(HandlerNotFound) as caught:
        submit_batch(sessions, settings, request, key=None, send=_Sender(sessions))
    assert caught.value.field == "tasks.1.type"


def test_submit_lists_every_problem_in_one_error(sessions, settings: Settings):
    settings.api.max_tasks_per_batch = 2
    request = BatchCreate.model_validate(
        {
            "tasks": [
                {"type": "echo", "config": {"text": ""}},
                {"type": "no-such-handler"},
                {"type": "echo", "config": {"text": "x", "colour": 1, "sleep_s": "long"}},
            ],
            "dynamic": {"target_groups": 9, "filter": "std"},
        }
    )
    with pytest.raises(InvalidSpec) as caught:
        submit_batch(sessions, settings, request, key=None, send=_Sender(sessions))
    assert caught.value.field == "tasks" and "(and 6 more)" in caught.value.message
    assert [p["field"] for p in caught.value.errors or []] == [
        "tasks",
        "tasks.0.config.text",
        "tasks.1.type",
        "tasks.2.config.sleep_s",
        "tasks.2.config.colour",
        "dynamic.target_groups",
        "group_size",
    ]


def _job_rows(sessions: sessionmaker[Session], batch_id: int) -> list[tuple[object, ...]]:
    with sessions() as s:
        jobs = s.scalars(select(Job).where(Job.batch_id == batch_id).order_by(Job.group_index, Job.sample_index))
        return [
            (j.group_index, j.sample_index, j.type, j.seed, j.state, j.stage_done, j.attempts, j.stage_attempts)
            for j in jobs
        ]


def test_submit_jobs_of_a_batch_and_of_a_dynamic_batchs_groups_start_alike(sessions, settings: Settings):
    # One builder makes both: the same seeds from the batch's seed, the same starting state.
    static = _request(sampling={"seed": 7})
    dynamic = _request(sampling={"seed": 7}, dynamic={"target_groups": 2, "filter": "std"})
    a = submit_batch(sessions, settings, static, key=None, send=_Sender(sessions))
    b = submit_batch(sessions, settings, dynamic, key=None, send=_Sender(sessions))
    rows = _job_rows(sessions, a.id)
    assert rows == _job_rows(sessions, b.id)
    assert [seed for *_, seed, _, _, _, _ in rows] == [(7 * 1_000_003 + i) % (2**31 - 1) for i in range(4)]
