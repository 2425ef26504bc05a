"""What the farm owes a job (its next stage, a teardown) and lost nodes, against both databases
(``farm.db.owed``, ``farm.db.teardowns``, ``farm.db.nodes``)."""

from __future__ import annotations

from datetime import timedelta

import pytest
from sqlalchemy import delete, select, update

from farm.constants import JobState, Outcome, Stage, StageStatus
from farm.db import nodes, owed, teardowns
from farm.db.base import utcnow
from farm.db.jobs import lifecycle
from farm.db.models import Job, Node, StageRun, Teardown
from farm.db.session import transaction
from tests.unit.test_lifecycle import claim, complete, job, make_batch


def due(sessions, batch_id: int, *, before=None) -> list[owed.Owed]:
    """What ``batch_id`` is owed (the PostgreSQL database is shared by the session's tests)."""
    with transaction(sessions) as s:
        found = owed.due(s.connection(), before=before or utcnow() + timedelta(seconds=1), limit=100_000)
    return sorted((o for o in found if o.batch_id == batch_id), key=lambda o: o.job_id)


def test_a_new_batch_owes_each_job_its_init(sessions):
    batch_id, job_ids = make_batch(sessions)
    found = due(sessions, batch_id)
    assert [o.job_id for o in found] == job_ids
    assert {(o.stage, o.node, o.batch_id) for o in found} == {(Stage.INIT, None, batch_id)}
    assert all(o.task_id == job(sessions, o.job_id).task_id for o in found)


def test_a_claimed_stage_is_not_owed_and_a_completed_one_owes_the_next_on_its_node(sessions):
    batch_id, (first, second) = make_batch(sessions)
    claim(sessions, first, Stage.INIT)
    assert [o.job_id for o in due(sessions, batch_id)] == [second]
    complete(sessions, claim(sessions, second, Stage.INIT))
    assert due(sessions, batch_id) == []
    [item] = due(sessions, batch_id, before=utcnow() + timedelta(seconds=60))
    assert (item.job_id, item.stage, item.node) == (second, Stage.RUN, "n1")


def test_owed_stages_are_due_only_after_their_resend_time(sessions):
    batch_id, (job_id,) = make_batch(sessions, group_size=1)
    complete(sessions, claim(sessions, job_id, Stage.INIT))
    with transaction(sessions) as s:
        owed.postpone(s.connection(), [job_id], until=utcnow() + timedelta(seconds=60))
    assert due(sessions, batch_id) == []
    [item] = due(sessions, batch_id, before=utcnow() + timedelta(seconds=61))
    assert (item.job_id, item.stage, item.node) == (job_id, Stage.RUN, "n1")


def test_finished_and_running_jobs_owe_nothing(sessions):
    batch_id, (job_id,) = make_batch(sessions, group_size=1)
    for stage in Stage:
        complete(sessions, claim(sessions, job_id, stage))
    assert job(sessions, job_id).state is JobState.DONE
    assert due(sessions, batch_id, before=utcnow() + timedelta(days=1)) == []


def test_a_stage_given_back_without_an_owner_is_owed_again(sessions):
    batch_id, (job_id,) = make_batch(sessions, group_size=1)
    c = claim(sessions, job_id, Stage.INIT)
    with transaction(sessions) as s:
        s.execute(update(Job).where(Job.id == job_id).values(worker=None, lease_until=utcnow() - timedelta(seconds=1)))
    assert [(o.job_id, o.stage) for o in due(sessions, batch_id)] == [(job_id, c.stage)]


@pytest.fixture
def no_nodes(sessions):
    """No node has reported yet (the PostgreSQL database is shared by the session's tests)."""
    with transaction(sessions) as s:
        s.execute(delete(Node))


def beat(sessions, node: str, at, gap_s: float = 15.0):
    with transaction(sessions) as s:
        return nodes.heartbeat(s.connection(), node, now=at, gap_since=at - timedelta(seconds=gap_s))


def test_a_node_reporting_without_gaps_keeps_its_start_and_a_gap_starts_a_new_run(sessions, no_nodes):
    t0 = utcnow()
    assert beat(sessions, "a", t0) == t0
    assert beat(sessions, "a", t0 + timedelta(seconds=10)) == t0
    later = t0 + timedelta(seconds=60)
    assert beat(sessions, "a", later) == later


def test_a_silent_node_holding_jobs_is_lost_and_a_reporting_one_is_not(sessions, no_nodes):
    _, (on_a, on_b) = make_batch(sessions)
    claim(sessions, on_a, Stage.INIT)  # node n1
    t0 = utcnow()
    beat(sessions, "n1", t0 - timedelta(seconds=100))
    with transaction(sessions) as s:
        assert nodes.lost(s.connection(), now=t0, silent_since=t0 - timedelta(seconds=50)) == [
            ("n1", t0 - timedelta(seconds=100))
        ]
    beat(sessions, "n1", t0)
    with transaction(sessions) as s:
        assert nodes.lost(s.connection(), now=t0, silent_since=t0 - timedelta(seconds=50)) == []


def test_a_node_that_never_reported_gets_the_whole_bound_from_when_it_is_first_noticed(sessions, no_nodes):
    _, (job_id, _) = make_batch(sessions)
    claim(sessions, job_id, Stage.INIT)
    t0 = utcnow()
    with transaction(sessions) as s:
        assert nodes.lost(s.connection(), now=t0, silent_since=t0 - timedelta(seconds=50)) == []
    with sessions() as s:
        assert s.get_one(Node, "n1").seen_at == t0
    with transaction(sessions) as s:
        later = t0 + timedelta(seconds=51)
        lost = nodes.lost(s.connection(), now=later, silent_since=later - timedelta(seconds=50))
    # Other tests' jobs on other nodes may share the database: judge only this test's node.
    assert [(name, seen) for name, seen in lost if name == "n1"] == [("n1", t0)]


def hand_on(sessions, *, restart: bool, max_restarts: int = 3):
    now = utcnow()
    with transaction(sessions) as s:
        return nodes.hand_on(
            s.connection(),
            "n1",
            now=now,
            seen_at=now - timedelta(seconds=300),
            restart=restart,
            max_restarts=max_restarts,
            owed_until=now,
        )


def test_a_lost_nodes_jobs_start_over_from_init_with_the_running_attempt_recorded_lost(sessions, no_nodes):
    _, (running, owed_run) = make_batch(sessions)
    complete(sessions, claim(sessions, running, Stage.INIT))
    claim(sessions, running, Stage.RUN)
    complete(sessions, claim(sessions, owed_run, Stage.INIT))

    out = hand_on(sessions, restart=True)

    restarted = dict(out.restarted)
    assert {running, owed_run} <= set(restarted)
    for job_id in (running, owed_run):
        j = job(sessions, job_id)
        assert (j.state, j.stage_done, j.node, j.restarts, j.stage_data) == (JobState.QUEUED, True, None, 1, {})
        assert j.task_id == restarted[job_id]
    with sessions() as s:
        lost = s.execute(select(StageRun.stage, StageRun.status, StageRun.error).where(StageRun.job_id == running))
        assert [(r.stage, r.status, r.error.startswith("node lost")) for r in lost if r.status is StageStatus.LOST] == [
            (Stage.RUN, StageStatus.LOST, True)
        ]
    # Started over, the job runs through on another node and ends once.
    c = claim(sessions, running, Stage.INIT)
    assert c.skip is None and c.attempt == 1


def test_a_lost_nodes_jobs_fail_as_infra_error_when_told_or_after_too_many_restarts(sessions, no_nodes):
    _, (first, second) = make_batch(sessions)
    for job_id in (first, second):
        complete(sessions, claim(sessions, job_id, Stage.INIT))
    out = hand_on(sessions, restart=False)
    assert out.failed >= 2 and not {first, second} & set(dict(out.restarted))
    for job_id in (first, second):
        j = job(sessions, job_id)
        assert (
            j.state is JobState.FAILED and j.outcome is Outcome.INFRA_ERROR and (j.reason or "").startswith("node lost")
        )
        assert j.finish_seq is not None

    _, (third, in_init) = make_batch(sessions)
    complete(sessions, claim(sessions, third, Stage.INIT))
    claim(sessions, in_init, Stage.INIT)
    out = hand_on(sessions, restart=False)
    # A job whose INIT was still running on the lost node was not past INIT: it starts again.
    assert job(sessions, third).state is JobState.FAILED
    assert in_init in dict(out.restarted) and job(sessions, in_init).state is JobState.QUEUED

    _, (fourth, _) = make_batch(sessions)
    complete(sessions, claim(sessions, fourth, Stage.INIT))
    out = hand_on(sessions, restart=True, max_restarts=0)
    assert out.failed >= 1 and job(sessions, fourth).state is JobState.FAILED


def owed_teardowns(sessions, job_ids) -> dict[int, tuple[str, Stage]]:
    with sessions() as s:
        rows = s.execute(select(Teardown).where(Teardown.job_id.in_(job_ids))).scalars()
        return {row.job_id: (row.node, row.stage) for row in rows}


def test_cancel_owes_a_teardown_on_the_node_of_each_job_past_init(sessions):
    batch_id, job_ids = make_batch(sessions, group_size=4)
    in_init, owed_run, in_run, queued = job_ids
    claim(sessions, in_init, Stage.INIT)
    complete(sessions, claim(sessions, owed_run, Stage.INIT))
    complete(sessions, claim(sessions, in_run, Stage.INIT))
    claim(sessions, in_run, Stage.RUN)
    with transaction(sessions) as s:
        lifecycle.cancel_batch(s.connection(), batch_id=batch_id, now=utcnow(), teardown_due=utcnow())
    # The stage whose message reaches the node's queue: RUN for INIT and RUN, nothing for a queued job.
    assert owed_teardowns(sessions, job_ids) == {
        in_init: ("n1", Stage.RUN),
        owed_run: ("n1", Stage.RUN),
        in_run: ("n1", Stage.RUN),
    }
    with transaction(sessions) as s:
        due = teardowns.due(s.connection(), before=utcnow() + timedelta(seconds=1), limit=100_000)
        teardowns.postpone(s.connection(), [in_init], until=utcnow() + timedelta(seconds=60))
        teardowns.settle(s.connection(), owed_run)
    assert {in_init, owed_run, in_run} <= {t.job_id for t in due}
    with transaction(sessions) as s:
        still = {t.job_id for t in teardowns.due(s.connection(), before=utcnow() + timedelta(seconds=1))}
    assert in_run in still and in_init not in still and owed_run not in still
