"""The job state machine against both databases: claims, leases, completion, finish order, cancel."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest
from sqlalchemy import func, select, update

from farm.config import Settings
from farm.constants import BatchState, JobState, Outcome, Stage, StageStatus
from farm.db import batches, reads
from farm.db.base import utcnow
from farm.db.jobs import attempts, claims, completions, lifecycle
from farm.db.models import Job, StageRun, Trajectory, check_transition
from farm.db.sampling import BatchSettings, SamplingCache
from farm.db.session import make_autocommit_engine, transaction
from farm.errors import ClaimLost, InvalidTransition
from farm.schemas import BatchCreate, EvalResult, RunResult, SamplingParams, TrajectoryData

LEASE_S = 30.0


def make_batch(sessions, n_tasks: int = 1, group_size: int = 2) -> tuple[int, list[int]]:
    request = BatchCreate(
        tasks=[{"type": "echo", "config": {"text": f"t{i}"}} for i in range(n_tasks)], group_size=group_size
    )
    with transaction(sessions) as s:
        batch, job_ids = batches.create_batch(
            s, request, idempotency_key=None, digest=batches.request_hash(request), now=utcnow(), owed_until=utcnow()
        )
        return batch.id, job_ids


def claim(sessions, job_id: int, stage: Stage, worker: str = "w1", now=None, max_attempts: int = 3):
    with transaction(sessions) as s:
        return claims.claim_stage(
            s.connection(),
            job_id=job_id,
            stage=stage,
            node="n1",
            worker=worker,
            now=now or utcnow(),
            lease_s=LEASE_S,
            max_attempts=max_attempts,
        )


def complete(sessions, c: claims.Claim, worker: str = "w1"):
    """Record a canned result for the attempt ``c`` claimed, as ``worker``."""
    if c.stage is Stage.INIT:
        output = completions.StageOutput(init_state={"x": 1})
    elif c.stage is Stage.RUN:
        run = RunResult(
            trajectory=TrajectoryData(token_ids=[5, 6, 7], logprobs=[0.0, -0.5, -0.25], loss_mask=[0, 1, 1]),
            state={"y": 2},
        )
        output = completions.StageOutput(run_result=run)
    else:
        output = completions.StageOutput(eval_result=EvalResult(reward=0.75, metrics={"m": 1.0}))
    with transaction(sessions) as s:
        return completions.complete_stage(
            s.connection(),
            c,
            output,
            worker=worker,
            now=utcnow(),
            owed_until=utcnow() + timedelta(seconds=LEASE_S),
        )


def job(sessions, job_id: int) -> Job:
    with sessions() as s:
        return s.get_one(Job, job_id)


def test_job_runs_through_all_stages_and_records_history(sessions):
    batch_id, (job_id, _) = make_batch(sessions)
    for stage in Stage:
        c = claim(sessions, job_id, stage)
        assert c.skip is None and c.attempt == 1
        done = complete(sessions, c)
        assert done.recorded
    j = job(sessions, job_id)
    assert j.state is JobState.DONE and j.outcome is Outcome.OK and j.reward == 0.75
    assert j.init_at and j.run_at and j.eval_at and j.finished_at
    assert j.init_at <= j.run_at <= j.eval_at <= j.finished_at
    with sessions() as s:
        runs = s.scalars(select(StageRun).where(StageRun.job_id == job_id).order_by(StageRun.id)).all()
        assert [(r.stage, r.status) for r in runs] == [(st, StageStatus.OK) for st in Stage]
        traj = s.get_one(Trajectory, job_id)
        assert traj.reward == 0.75 and set(traj.timings) >= {"init_s", "run_s", "eval_s", "total_s"}


def test_claim_passes_state_between_stages(sessions):
    _, (job_id, _) = make_batch(sessions)
    complete(sessions, claim(sessions, job_id, Stage.INIT))
    c = claim(sessions, job_id, Stage.RUN)
    assert c.state == {"x": 1}
    complete(sessions, c)
    c = claim(sessions, job_id, Stage.EVAL)
    assert c.state == {"x": 1, "y": 2}
    assert c.trajectory is not None and c.trajectory.token_ids == [5, 6, 7]
    assert c.trajectory.logprobs == [0.0, -0.5, -0.25] and c.trajectory.loss_mask == [0, 1, 1]


def test_duplicate_delivery_is_skipped_while_lease_is_live(sessions):
    _, (job_id, _) = make_batch(sessions)
    assert claim(sessions, job_id, Stage.INIT, worker="w1").skip is None
    second = claim(sessions, job_id, Stage.INIT, worker="w2")
    assert second.skip is not None and "live lease" in second.skip


def test_completed_stage_is_not_run_again(sessions):
    _, (job_id, _) = make_batch(sessions)
    complete(sessions, claim(sessions, job_id, Stage.INIT))
    again = claim(sessions, job_id, Stage.INIT, worker="w2")
    assert again.skip is not None


def test_stage_out_of_order_is_skipped(sessions):
    _, (job_id, _) = make_batch(sessions)
    c = claim(sessions, job_id, Stage.EVAL)
    assert c.skip is not None and "not ready" in c.skip


def test_lapsed_lease_lets_another_worker_take_over_and_old_result_is_discarded(sessions):
    _, (job_id, _) = make_batch(sessions)
    dead = claim(sessions, job_id, Stage.INIT, worker="dead")
    later = utcnow() + timedelta(seconds=LEASE_S + 1)
    with transaction(sessions) as s:
        resend = lifecycle.expired_leases(s.connection(), now=later, resend_until=later + timedelta(seconds=LEASE_S))
    assert (job_id, Stage.INIT) in [(j, st) for j, st, _, _ in resend]
    taken = claim(sessions, job_id, Stage.INIT, worker="alive", now=later)
    assert taken.skip is None and taken.attempt == 2
    assert not complete(sessions, dead, worker="dead").recorded
    assert complete(sessions, taken, worker="alive").recorded
    with sessions() as s:
        statuses = s.scalars(select(StageRun.status).where(StageRun.job_id == job_id).order_by(StageRun.id)).all()
    assert statuses == [StageStatus.LOST, StageStatus.OK]


def test_attempts_exhausted_fails_job_with_infra_outcome(sessions):
    _, (job_id, _) = make_batch(sessions)
    now = utcnow()
    for attempt in range(2):
        assert (
            claim(sessions, job_id, Stage.INIT, now=now + timedelta(seconds=attempt * 100), max_attempts=2).skip is None
        )
    gave_up = claim(sessions, job_id, Stage.INIT, now=now + timedelta(seconds=300), max_attempts=2)
    assert gave_up.gave_up
    j = job(sessions, job_id)
    assert j.state is JobState.FAILED and j.outcome is Outcome.INFRA_ERROR and j.reward is None


def test_finish_seq_follows_finish_order_and_completes_batch(sessions):
    batch_id, job_ids = make_batch(sessions, n_tasks=2, group_size=2)
    for job_id in reversed(job_ids):
        for stage in Stage:
            complete(sessions, claim(sessions, job_id, stage))
    with sessions() as s:
        seqs = {j.id: j.finish_seq for j in s.scalars(select(Job).where(Job.batch_id == batch_id))}
        status = reads.batch_status(s, batch_id)
    assert [seqs[j] for j in reversed(job_ids)] == [1, 2, 3, 4]
    assert status.state is BatchState.COMPLETE and status.finished_jobs == 4


def test_cancel_batch_cancels_unfinished_jobs_and_revokes_only_queued(sessions):
    batch_id, (a, b, c, d) = make_batch(sessions, n_tasks=2, group_size=2)
    for stage in Stage:  # a finishes
        complete(sessions, claim(sessions, a, stage))
    running = claim(sessions, b, Stage.INIT)  # b is running INIT
    with transaction(sessions) as s:
        revoked = lifecycle.cancel_batch(s.connection(), batch_id=batch_id, now=utcnow(), teardown_due=utcnow())
    assert len(revoked) == 2  # c and d were still queued
    assert job(sessions, a).state is JobState.DONE
    for j in (b, c, d):
        assert job(sessions, j).state is JobState.CANCELLED
    # b's running stage finds the cancel when it tries to record its result
    assert complete(sessions, running).reason == "cancelled"
    with sessions() as s:
        status = reads.batch_status(s, batch_id)
        seqs = sorted(s.scalars(select(Job.finish_seq).where(Job.batch_id == batch_id)))
    assert status.state is BatchState.CANCELLED and seqs == [1, 2, 3, 4]


def test_rerun_of_run_overwrites_its_trajectory(sessions):
    _, (job_id, _) = make_batch(sessions)
    complete(sessions, claim(sessions, job_id, Stage.INIT))
    with transaction(sessions) as s:
        rerun = claims.claim_stage(
            s.connection(),
            job_id=job_id,
            stage=Stage.RUN,
            node="n",
            worker="w1",
            now=utcnow(),
            lease_s=LEASE_S,
            max_attempts=3,
        )
        attempts.save_trajectory(
            s.connection(), job_id, RunResult(trajectory=TrajectoryData(token_ids=[1], logprobs=[0.0], loss_mask=[0]))
        )
    complete(sessions, rerun, worker="w1")
    with sessions() as s:
        assert s.scalar(select(func.count()).select_from(Trajectory).where(Trajectory.job_id == job_id)) == 1
        assert s.get_one(Trajectory, job_id).num_tokens == 3


@pytest.mark.parametrize(
    ("start", "to"),
    [
        (JobState.QUEUED, JobState.RUN),
        (JobState.QUEUED, JobState.DONE),
        (JobState.DONE, JobState.RUN),
        (JobState.CANCELLED, JobState.DONE),
        (JobState.RUN, JobState.INIT),
    ],
)
def test_check_transition_rejects_illegal_moves(start, to):
    with pytest.raises(InvalidTransition, match=f"from {start.value} to {to.value}"):
        check_transition(1, start, to)


def test_check_transition_allows_the_state_machine_and_every_cancel():
    for start, to in [
        (JobState.QUEUED, JobState.INIT),
        (JobState.INIT, JobState.RUN),
        (JobState.RUN, JobState.EVAL),
        (JobState.EVAL, JobState.DONE),
        (JobState.RUN, JobState.FAILED),
    ]:
        check_transition(1, start, to)
    for start in (JobState.QUEUED, JobState.INIT, JobState.RUN, JobState.EVAL):
        check_transition(1, start, JobState.CANCELLED)


def test_renew_leases_keeps_owned_jobs_and_reports_the_rest(sessions):
    _, (a, b) = make_batch(sessions)
    claim(sessions, a, Stage.INIT, worker="w1")
    complete(sessions, claim(sessions, b, Stage.INIT, worker="w1"), worker="w1")  # b's stage ended: no lease to renew
    until = utcnow() + timedelta(seconds=LEASE_S)
    with transaction(sessions) as s:
        kept = lifecycle.renew_leases(s.connection(), job_ids=[a, b], worker="w1", until=until)
        assert kept == {a}
        assert lifecycle.renew_leases(s.connection(), job_ids=[a], worker="someone-else", until=until) == set()
    assert job(sessions, a).lease_until == until


def test_a_resent_stage_that_never_arrives_is_resent_again(sessions):
    _, (job_id, _) = make_batch(sessions)
    claim(sessions, job_id, Stage.INIT, worker="dead")
    t1 = utcnow() + timedelta(seconds=LEASE_S + 1)
    with transaction(sessions) as s:
        first = lifecycle.expired_leases(s.connection(), now=t1, resend_until=t1 + timedelta(seconds=LEASE_S))
        # Within the re-send window nobody sends it again...
        assert job_id not in [j for j, *_ in lifecycle.expired_leases(s.connection(), now=t1, resend_until=t1)]
    # ...but once the window lapses with no claim (the message was lost), it is re-sent with a new id.
    t2 = t1 + timedelta(seconds=LEASE_S + 1)
    with transaction(sessions) as s:
        second = lifecycle.expired_leases(s.connection(), now=t2, resend_until=t2 + timedelta(seconds=LEASE_S))
    (a,) = [r for r in first if r[0] == job_id]
    (b,) = [r for r in second if r[0] == job_id]
    assert a[3] != b[3]
    # Any worker may claim the re-sent stage during the window: the lease belongs to no one.
    assert claim(sessions, job_id, Stage.INIT, worker="alive", now=t2).skip is None


def history(sessions, job_id: int) -> list[tuple]:
    with sessions() as s:
        return [(h.stage, h.attempt, h.status, h.worker) for h in reads.get_job(s, job_id).stages]


def test_running_attempt_shows_in_history_and_gets_its_row_when_it_ends(sessions):
    _, (job_id, _) = make_batch(sessions)
    c = claim(sessions, job_id, Stage.INIT, worker="w1")
    with sessions() as s:
        assert s.scalar(select(func.count()).select_from(StageRun).where(StageRun.job_id == job_id)) == 0
    assert history(sessions, job_id) == [(Stage.INIT, 1, StageStatus.RUNNING, "w1")]
    complete(sessions, c)
    assert history(sessions, job_id) == [(Stage.INIT, 1, StageStatus.OK, "w1")]


def test_handler_changing_its_state_does_not_change_what_is_stored(sessions):
    _, (job_id, _) = make_batch(sessions)
    complete(sessions, claim(sessions, job_id, Stage.INIT))
    c = claim(sessions, job_id, Stage.RUN)
    c.state["x"] = "changed by the handler"
    complete(sessions, c)
    assert claim(sessions, job_id, Stage.EVAL).state == {"x": 1, "y": 2}


def test_completion_of_an_older_attempt_by_the_same_worker_writes_the_job_row_as_it_is(sessions):
    # Given a worker whose lease lapsed and who then took its own stage over (attempt 2)...
    _, (job_id, _) = make_batch(sessions)
    first = claim(sessions, job_id, Stage.INIT, worker="w1")
    later = utcnow() + timedelta(seconds=LEASE_S + 1)
    second = claim(sessions, job_id, Stage.INIT, worker="w1", now=later)
    assert second.attempt == 2
    # ...when attempt 1 finishes first, it is recorded for the attempt the job row holds.
    assert complete(sessions, first).recorded
    assert not complete(sessions, second).recorded
    assert history(sessions, job_id) == [(Stage.INIT, 1, StageStatus.LOST, "w1"), (Stage.INIT, 2, StageStatus.OK, "w1")]


def test_sweeper_records_the_attempt_it_takes_back_as_lost(sessions):
    _, (job_id, _) = make_batch(sessions)
    claim(sessions, job_id, Stage.INIT, worker="dead")
    later = utcnow() + timedelta(seconds=LEASE_S + 1)
    with transaction(sessions) as s:
        lifecycle.expired_leases(s.connection(), now=later, resend_until=later + timedelta(seconds=LEASE_S))
    assert history(sessions, job_id) == [(Stage.INIT, 1, StageStatus.LOST, "dead")]
    taken = claim(sessions, job_id, Stage.INIT, worker="alive", now=later)
    complete(sessions, taken, worker="alive")
    assert history(sessions, job_id) == [
        (Stage.INIT, 1, StageStatus.LOST, "dead"),
        (Stage.INIT, 2, StageStatus.OK, "alive"),
    ]


def test_cancel_records_the_running_attempt_as_cancelled(sessions):
    batch_id, (job_id, _) = make_batch(sessions)
    running = claim(sessions, job_id, Stage.INIT, worker="w1")
    with transaction(sessions) as s:
        lifecycle.cancel_batch(s.connection(), batch_id=batch_id, now=utcnow(), teardown_due=utcnow())
    assert history(sessions, job_id) == [(Stage.INIT, 1, StageStatus.CANCELLED, "w1")]
    assert complete(sessions, running).reason == "cancelled"
    assert history(sessions, job_id) == [(Stage.INIT, 1, StageStatus.CANCELLED, "w1")]


def test_retry_and_failure_record_one_row_per_attempt(sessions):
    _, (job_id, _) = make_batch(sessions)
    claim(sessions, job_id, Stage.INIT, worker="w1")
    now = utcnow()
    with transaction(sessions) as s:
        task_id = lifecycle.retry_stage(
            s.connection(), job_id=job_id, stage=Stage.INIT, worker="w1", now=now, error="boom", resend_until=now
        )
    assert task_id is not None
    assert claim(sessions, job_id, Stage.INIT, worker="w1").attempt == 2
    with transaction(sessions) as s:
        assert lifecycle.fail_stage(
            s.connection(),
            job_id=job_id,
            stage=Stage.INIT,
            worker="w1",
            now=utcnow(),
            outcome=Outcome.SANDBOX_ERROR,
            error="x",
        )
    assert history(sessions, job_id) == [
        (Stage.INIT, 1, StageStatus.RETRY, "w1"),
        (Stage.INIT, 2, StageStatus.ERROR, "w1"),
    ]
    assert job(sessions, job_id).state is JobState.FAILED


def test_claim_reads_a_batchs_sampling_once_per_cache(sessions):
    _, (a, b) = make_batch(sessions)
    samplings = SamplingCache()
    first = claim_with(sessions, a, samplings)
    assert first.config == {"text": "t0"} and samplings.get(first.batch_id) == (first.sampling, "exact", None, False)
    second = claim_with(sessions, b, samplings)
    assert second.config == first.config and second.sampling is first.sampling


def claim_with(sessions, job_id: int, samplings: SamplingCache) -> claims.Claim:
    with transaction(sessions) as s:
        return claims.claim_stage(
            s.connection(),
            job_id=job_id,
            stage=Stage.INIT,
            node="n1",
            worker="w",
            now=utcnow(),
            lease_s=LEASE_S,
            max_attempts=3,
            samplings=samplings,
        )


def test_sampling_cache_drops_its_oldest_entries_when_full():
    samplings = SamplingCache(size=2)
    sampling = BatchSettings(SamplingParams(), "exact")
    for batch_id in (1, 2, 3):
        samplings.put(batch_id, sampling)
    assert samplings.get(1) is None and samplings.get(2) is sampling and samplings.get(3) is sampling


def test_a_claim_the_database_lost_is_reported_so_the_stage_is_delivered_again(sessions):
    _, (job_id, _) = make_batch(sessions)
    c = claim(sessions, job_id, Stage.INIT)
    # Given a database that restarted before the claim (committed without waiting for the disk)
    # reached it: the job is back where it was.
    with transaction(sessions) as s:
        s.execute(update(Job).where(Job.id == job_id).values(state=JobState.QUEUED, stage_done=True, worker=None))
    with pytest.raises(ClaimLost):
        complete(sessions, c)
    with pytest.raises(ClaimLost), transaction(sessions) as s:
        now = utcnow()
        lifecycle.retry_stage(
            s.connection(), job_id=job_id, stage=Stage.INIT, worker="w1", now=now, error="x", resend_until=now
        )
    assert claim(sessions, job_id, Stage.INIT).attempt == 1


def test_usual_claim_and_completion_work_as_single_autocommitted_statements(db_url, sessions):
    autocommit = make_autocommit_engine(Settings(), url=db_url, durable=False)
    if autocommit is None:
        pytest.skip("SQLite writes only in transactions")
    _, (job_id, _) = make_batch(sessions)
    try:
        with autocommit.connect() as conn:
            c = claims.claim_next(
                conn, job_id=job_id, stage=Stage.INIT, node="n1", worker="w1", now=utcnow(), lease_s=LEASE_S
            )
            assert c is not None and c.attempt == 1
            done = completions.complete_next(
                conn, c, completions.StageOutput(init_state={"x": 1}), worker="w1", now=utcnow(), owed_until=utcnow()
            )
            assert done is not None and done.next_stage is Stage.RUN
            # A second completion of the same attempt is not the usual case: it falls back.
            assert (
                completions.complete_next(
                    conn,
                    c,
                    completions.StageOutput(init_state={"x": 1}),
                    worker="w1",
                    now=utcnow(),
                    owed_until=utcnow(),
                )
                is None
            )
    finally:
        autocommit.dispose()
    assert history(sessions, job_id) == [(Stage.INIT, 1, StageStatus.OK, "w1")]
    assert claim(sessions, job_id, Stage.RUN).state == {"x": 1}


def _eval_result(reward: float) -> EvalResult:
    return EvalResult(reward=reward, metrics={"m": reward})


def test_finishing_completions_in_one_statement_each_take_one_finish_position(db_url, sessions):
    """EVAL's usual completion (and a RUN that ends the job) takes its place in the finish order
    in its own statement; concurrent ones get distinct places, and the last completes the batch."""
    from concurrent.futures import ThreadPoolExecutor

    durable = make_autocommit_engine(Settings(), url=db_url, durable=True)
    if durable is None:
        pytest.skip("SQLite writes only in transactions")
    batch_id, job_ids = make_batch(sessions, n_tasks=4, group_size=2)
    evals = []
    for job_id in job_ids[:-1]:
        for stage in (Stage.INIT, Stage.RUN):
            complete(sessions, claim(sessions, job_id, stage))
        evals.append(claim(sessions, job_id, Stage.EVAL))
    # The last job's RUN ends it: its sandbox broke, so there is nothing to score.
    last = job_ids[-1]
    complete(sessions, claim(sessions, last, Stage.INIT))
    run_claim = claim(sessions, last, Stage.RUN)
    failed_run = RunResult(
        trajectory=TrajectoryData(token_ids=[5, 6], logprobs=[0.0, -0.5], loss_mask=[0, 1]),
        outcome=Outcome.SANDBOX_ERROR,
        reason="the sandbox died",
    )
    assert completions.finishes(Stage.RUN, failed_run) and completions.finishes(Stage.EVAL, None)

    def finish(c: claims.Claim) -> completions.Completion | None:
        with durable.connect() as conn:
            if c.stage is Stage.RUN:
                return completions.complete_next(
                    conn,
                    c,
                    completions.StageOutput(run_result=failed_run),
                    worker="w1",
                    now=utcnow(),
                    owed_until=utcnow(),
                )
            return completions.complete_next(
                conn,
                c,
                completions.StageOutput(eval_result=_eval_result(0.5)),
                worker="w1",
                now=utcnow(),
                owed_until=utcnow(),
            )

    try:
        with ThreadPoolExecutor(4) as pool:
            done = list(pool.map(finish, [*evals, run_claim]))
        assert [d.finished if d else None for d in done] == [JobState.DONE] * len(evals) + [JobState.FAILED]
        # The same attempt again is not the usual case: nothing written, no place taken.
        assert finish(evals[0]) is None
    finally:
        durable.dispose()
    with sessions() as s:
        jobs = {j.id: j for j in s.scalars(select(Job).where(Job.batch_id == batch_id))}
        status = reads.batch_status(s, batch_id)
        scored = s.scalars(select(Trajectory.reward).where(Trajectory.job_id.in_(job_ids[:-1]))).all()
    assert sorted(j.finish_seq for j in jobs.values()) == list(range(1, len(job_ids) + 1))
    assert jobs[last].state is JobState.FAILED and jobs[last].outcome is Outcome.SANDBOX_ERROR
    assert all(jobs[j].state is JobState.DONE and jobs[j].reward == 0.5 for j in job_ids[:-1])
    assert scored == [0.5] * len(evals)
    assert status.state is BatchState.COMPLETE and status.finished_jobs == len(job_ids)
    assert history(sessions, evals[0].job_id)[-1] == (Stage.EVAL, 1, StageStatus.OK, "w1")


def test_a_message_for_a_cancelled_job_is_skipped_with_what_its_teardown_needs(sessions):
    # Given a job past INIT on n1 whose batch is then cancelled,
    batch_id, (job_id, _) = make_batch(sessions)
    complete(sessions, claim(sessions, job_id, Stage.INIT))
    with transaction(sessions) as s:
        lifecycle.cancel_batch(s.connection(), batch_id=batch_id, now=utcnow(), teardown_due=utcnow())
    # when its RUN message arrives, it is skipped but names the sandbox n1 must tear down.
    late = claim(sessions, job_id, Stage.RUN)
    assert late.skip == "job is already cancelled"
    assert (late.type, late.node, late.config, late.state) == ("echo", "n1", {"text": "t0"}, {"x": 1})


def test_init_taken_over_on_another_node_moves_the_job_there(sessions):
    _, (job_id, _) = make_batch(sessions)
    claim(sessions, job_id, Stage.INIT)  # on n1, which then stalls
    later = utcnow() + timedelta(seconds=LEASE_S + 1)
    with transaction(sessions) as s:
        taken = claims.claim_stage(
            s.connection(),
            job_id=job_id,
            stage=Stage.INIT,
            node="n2",
            worker="w2",
            now=later,
            lease_s=LEASE_S,
            max_attempts=3,
        )
    assert taken.attempt == 2 and taken.node == "n2"
    assert job(sessions, job_id).node == "n2"


@pytest.mark.parametrize(
    ("outcome", "state"), [(Outcome.CANCELLED, JobState.CANCELLED), (Outcome.SANDBOX_ERROR, JobState.FAILED)]
)
def test_run_that_ends_with_nothing_to_score_finishes_the_job(sessions, outcome, state):
    _, (job_id, _) = make_batch(sessions)
    complete(sessions, claim(sessions, job_id, Stage.INIT))
    c = claim(sessions, job_id, Stage.RUN)
    result = RunResult(trajectory=TrajectoryData(token_ids=[5], logprobs=[0.0], loss_mask=[0]), outcome=outcome)
    with transaction(sessions) as s:
        done = completions.complete_stage(
            s.connection(),
            c,
            completions.StageOutput(run_result=result),
            worker="w1",
            now=utcnow(),
            owed_until=utcnow(),
        )
    assert (done.finished, done.next_stage) == (state, None)
    j = job(sessions, job_id)
    assert (j.state, j.outcome, j.reward) == (state, outcome, None)


def test_eval_keeps_the_outcome_the_policy_earned_in_run(sessions):
    _, (job_id, _) = make_batch(sessions)
    complete(sessions, claim(sessions, job_id, Stage.INIT))
    c = claim(sessions, job_id, Stage.RUN)
    result = RunResult(
        trajectory=TrajectoryData(token_ids=[5], logprobs=[0.0], loss_mask=[1]),
        outcome=Outcome.AGENT_TIMEOUT,
        reason="out of time",
    )
    with transaction(sessions) as s:
        completions.complete_stage(
            s.connection(),
            c,
            completions.StageOutput(run_result=result),
            worker="w1",
            now=utcnow(),
            owed_until=utcnow(),
        )
    complete(sessions, claim(sessions, job_id, Stage.EVAL))
    j = job(sessions, job_id)
    assert (j.state, j.outcome, j.reason, j.reward) == (JobState.DONE, Outcome.AGENT_TIMEOUT, "out of time", 0.75)


def test_an_older_attempt_that_finishes_the_job_takes_its_finish_position(sessions):
    # Given a worker whose EVAL lease lapsed and who then took the stage over (attempt 2),
    batch_id, (job_id,) = make_batch(sessions, group_size=1)
    for stage in (Stage.INIT, Stage.RUN):
        complete(sessions, claim(sessions, job_id, stage))
    first = claim(sessions, job_id, Stage.EVAL)
    assert claim(sessions, job_id, Stage.EVAL, now=utcnow() + timedelta(seconds=LEASE_S + 1)).attempt == 2
    # when attempt 1 finishes the job, the job still takes a finish position and ends the batch.
    assert complete(sessions, first).finished is JobState.DONE
    with sessions() as s:
        assert s.get_one(Job, job_id).finish_seq == 1
        assert reads.batch_status(s, batch_id).state is BatchState.COMPLETE


def test_retry_or_failure_from_a_worker_that_no_longer_holds_the_stage_changes_nothing(sessions):
    _, (job_id, _) = make_batch(sessions)
    claim(sessions, job_id, Stage.INIT, worker="w1")
    now = utcnow()
    with transaction(sessions) as s:
        conn = s.connection()
        common: dict[str, Any] = {"job_id": job_id, "stage": Stage.INIT, "worker": "w2", "now": now, "error": "boom"}
        assert lifecycle.retry_stage(conn, **common, resend_until=now) is None
        assert lifecycle.fail_stage(conn, **common, outcome=Outcome.INFRA_ERROR) is False
    j = job(sessions, job_id)
    assert (j.state, j.worker, j.outcome) == (JobState.INIT, "w1", None)


def test_cancel_of_a_finished_batch_leaves_it_complete(sessions):
    batch_id, (job_id,) = make_batch(sessions, group_size=1)
    for stage in Stage:
        complete(sessions, claim(sessions, job_id, stage))
    with transaction(sessions) as s:
        assert lifecycle.cancel_batch(s.connection(), batch_id=batch_id, now=utcnow(), teardown_due=utcnow()) == []
    with sessions() as s:
        assert reads.batch_status(s, batch_id).state is BatchState.COMPLETE


def test_lease_sweep_leaves_a_completed_stage_to_the_reconciler(sessions):
    # A completed stage keeps lease_until as the time its next stage is owed by: not a lease.
    _, (job_id, _) = make_batch(sessions)
    complete(sessions, claim(sessions, job_id, Stage.INIT))
    later = utcnow() + timedelta(seconds=LEASE_S + 1)
    with transaction(sessions) as s:
        lapsed = lifecycle.expired_leases(s.connection(), now=later, resend_until=later)
    assert job_id not in [j for j, _, _, _ in lapsed]
    assert history(sessions, job_id) == [(Stage.INIT, 1, StageStatus.OK, "w1")]
