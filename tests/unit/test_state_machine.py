"""The job state machine's guards, table-driven, against both databases.

Every claim and completion runs against a job put in each state x ``stage_done`` x owner x
attempt, and its answer is checked against the rule written out here (``*_rule``), not taken
from the code under test. A refused step must leave the job row as it was. Then the cases a
table cannot show: a node's hand-on (the attempt number starts over, so only the worker tells
a cut-off worker's completion from the new one's) and a later stage claimed early.
"""

from __future__ import annotations

import itertools
import typing
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

import pytest
from sqlalchemy import select, update
from sqlalchemy.orm import Session, sessionmaker

from farm.config import Settings
from farm.constants import TERMINAL_STATES, JobState, Stage, StageStatus
from farm.db import batches, migrate, nodes
from farm.db.base import utcnow
from farm.db.jobs import attempts, claims, completions, jobrows, lifecycle
from farm.db.jobs import statements as sql
from farm.db.models import Batch, Group, Job, StageRun, Trajectory
from farm.db.session import make_engine, make_session_factory, transaction
from farm.errors import ClaimLost
from farm.schemas import BatchCreate, EvalResult, RunResult, TrajectoryData

LEASE_S = 30.0
MAX_ATTEMPTS = 3
ME, OTHER = "w-me", "w-other"
#: nodes of this module's own: tests that lose a node share the PostgreSQL database.
NODE, NEW_NODE = "sm-node-1", "sm-node-2"
STAGES = list(Stage)
STATES = list(JobState)
PREVIOUS = {Stage.INIT: JobState.QUEUED, Stage.RUN: JobState.INIT, Stage.EVAL: JobState.RUN}
RUNNING = {Stage.INIT: JobState.INIT, Stage.RUN: JobState.RUN, Stage.EVAL: JobState.EVAL}

Sessions = sessionmaker[Session]


@pytest.fixture(scope="module", params=["sqlite", pytest.param("postgresql", marks=pytest.mark.integration)])
def machine(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Sessions]:
    """One database per module for the tables (a fresh one per case would cost a migration each)."""
    if request.param == "sqlite":
        url = f"sqlite:///{tmp_path_factory.mktemp('machine') / 'farm.db'}"
        engine = make_engine(Settings(), url=url)
        migrate.upgrade(engine)
    else:
        engine = make_engine(Settings(), url=str(request.getfixturevalue("pg_url")))
    yield make_session_factory(engine)
    engine.dispose()


class Jobs:
    """Fresh jobs for the table's cases, made a batch at a time (a batch per case costs more
    than the case)."""

    def __init__(self, sessions: Sessions) -> None:
        self.sessions = sessions
        self.spare: list[int] = []

    def take(self) -> int:
        if not self.spare:
            self.spare = new_jobs(self.sessions, 100)
        return self.spare.pop()


@pytest.fixture(scope="module")
def jobs(machine: Sessions) -> Jobs:
    return Jobs(machine)


@dataclass(frozen=True)
class At:
    """Where a case puts the job: its state, whether that stage is done, who holds it, which attempt."""

    state: JobState
    stage_done: bool
    worker: str | None
    stage_attempts: int = 1
    lease_live: bool = True


def new_jobs(sessions: Sessions, n: int) -> list[int]:
    request = BatchCreate(tasks=[{"type": "echo", "config": {"text": f"t{i}"}} for i in range(n)], group_size=1)
    with transaction(sessions) as s:
        _, job_ids = batches.create_batch(
            s, request, idempotency_key=None, digest=batches.request_hash(request), now=utcnow(), owed_until=utcnow()
        )
    return job_ids


def job_at(jobs: Jobs, at: At, now: datetime) -> int:
    job_id, sessions = jobs.take(), jobs.sessions
    running = at.state in RUNNING.values() and not at.stage_done
    values = {
        "state": at.state,
        "stage_done": at.stage_done,
        "worker": at.worker,
        "stage_attempts": at.stage_attempts,
        "attempts": at.stage_attempts,
        "node": NODE,
        "lease_until": now + timedelta(seconds=LEASE_S if at.lease_live else -1),
        "stage_started_at": now - timedelta(seconds=5) if running else None,
        "stage_data": {"state": {"at": "start"}},
    }
    with transaction(sessions) as s:
        s.execute(update(Job).where(Job.id == job_id).values(values))
    return job_id


def row(sessions: Sessions, job_id: int) -> dict[str, Any]:
    with sessions() as s:
        return dict(s.execute(select(Job.__table__).where(Job.id == job_id)).one()._mapping)


def runs(sessions: Sessions, job_id: int) -> list[tuple[Stage, int, StageStatus, str | None]]:
    with sessions() as s:
        found = s.execute(select(StageRun).where(StageRun.job_id == job_id).order_by(StageRun.id)).scalars()
        return [(r.stage, r.attempt, r.status, r.worker) for r in found]


def case_id(stage: Stage, at: At) -> str:
    done = "done" if at.stage_done else "running"
    lease = "" if at.lease_live else "-lapsed"
    return f"{stage.value}@{at.state.value}-{done}-{at.worker or 'nobody'}-a{at.stage_attempts}{lease}"


# --- the usual claim: one conditional UPDATE (sql.CLAIM_NEXT) --------------------------------


def usual_claim_rule(stage: Stage, at: At) -> bool:
    """The usual claim takes a job only when the stage before is done (and so has no owner)."""
    return at.state is PREVIOUS[stage] and at.stage_done


USUAL_CLAIMS = [
    (stage, At(state, done, worker))
    for stage, state, done, worker in itertools.product(STAGES, STATES, (True, False), (None, OTHER))
]


@pytest.mark.parametrize(("stage", "at"), USUAL_CLAIMS, ids=[case_id(*c) for c in USUAL_CLAIMS])
def test_usual_claim_takes_a_job_only_when_the_stage_before_is_done(
    machine: Sessions, jobs: Jobs, stage: Stage, at: At
) -> None:
    now = utcnow()
    job_id = job_at(jobs, at, now)
    before = row(machine, job_id)
    with transaction(machine) as s:
        claim = claims.claim_next(
            s.connection(), job_id=job_id, stage=stage, node=NEW_NODE, worker=ME, now=now, lease_s=LEASE_S
        )
    after = row(machine, job_id)
    if not usual_claim_rule(stage, at):
        assert claim is None and after == before
        return
    assert claim is not None and (claim.stage, claim.attempt) == (stage, 1)
    assert (after["state"], after["stage_done"], after["worker"], after["stage_attempts"]) == (
        RUNNING[stage],
        False,
        ME,
        1,
    )
    assert after["node"] == (NEW_NODE if stage is Stage.INIT else NODE)


# --- every claim: the usual one, then the locking path (claims.claim_stage) ------------------


def claim_rule(stage: Stage, at: At) -> str:
    """What a delivery of ``stage`` does to a job: ``granted <attempt>``, ``gave up``, or ``skip``."""
    if at.state in TERMINAL_STATES:
        return "skip"
    if at.state is PREVIOUS[stage] and at.stage_done:
        return "granted 1"
    if at.state is RUNNING[stage] and not at.stage_done:
        if at.worker is not None and at.lease_live:
            return "skip"  # its owner is alive
        if at.stage_attempts >= MAX_ATTEMPTS:
            return "gave up"
        return f"granted {at.stage_attempts + 1}"  # the owner is gone (or none): the next attempt
    return "skip"  # this stage is over, or the job is not there yet


CLAIMS = [
    (stage, At(state, done, worker, attempt, live))
    for stage, state, done, worker, attempt, live in itertools.product(
        STAGES, STATES, (True, False), (None, OTHER), (1, MAX_ATTEMPTS), (True, False)
    )
]


@pytest.mark.parametrize(("stage", "at"), CLAIMS, ids=[case_id(*c) for c in CLAIMS])
def test_claim_grants_skips_or_gives_up_as_the_rule_says(machine: Sessions, jobs: Jobs, stage: Stage, at: At) -> None:
    now = utcnow()
    job_id = job_at(jobs, at, now)
    before = row(machine, job_id)
    with transaction(machine) as s:
        claim = claims.claim_stage(
            s.connection(),
            job_id=job_id,
            stage=stage,
            node=NEW_NODE,
            worker=ME,
            now=now,
            lease_s=LEASE_S,
            max_attempts=MAX_ATTEMPTS,
        )
    after = row(machine, job_id)
    expected = claim_rule(stage, at)
    if expected == "skip":
        assert claim.skip is not None and not claim.gave_up
        assert after == before
        if at.state in TERMINAL_STATES:  # its sandbox may still be there: the skip says where
            assert (claim.type, claim.node, claim.state) == ("echo", NODE, {"at": "start"})
    elif expected == "gave up":
        assert claim.gave_up and after["state"] is JobState.FAILED
        assert runs(machine, job_id) == [(stage, at.stage_attempts, StageStatus.LOST, at.worker)]
    else:
        assert claim.skip is None and f"granted {claim.attempt}" == expected
        assert (after["state"], after["stage_done"], after["worker"], after["stage_attempts"]) == (
            RUNNING[stage],
            False,
            ME,
            claim.attempt,
        )
        # The attempt taken over is on record as lost; a claim of a stage owed gets no record.
        lost = [(stage, at.stage_attempts, StageStatus.LOST, at.worker)] if claim.attempt > 1 else []
        assert runs(machine, job_id) == lost


# --- every completion: the guarded statement, then the locking path (complete_stage) ----------


def completion_rule(stage: Stage, at: At) -> str:
    """What the completion of attempt 1 of ``stage`` by ``ME`` does: ``recorded <attempt>`` (the
    attempt the job row holds), ``claim lost`` (the job is back before the claim), or ``refused``."""
    if at.state is PREVIOUS[stage] and at.stage_done:
        return "claim lost"
    if at.state is RUNNING[stage] and not at.stage_done and at.worker == ME:
        return f"recorded {at.stage_attempts}"
    return "refused"


COMPLETIONS = [
    (stage, At(state, done, worker, attempt))
    for stage, state, done, worker, attempt in itertools.product(
        STAGES, STATES, (True, False), (ME, OTHER, None), (1, 2)
    )
]


def output_of(stage: Stage, tag: str) -> completions.StageOutput:
    """A canned result; ``tag`` shows whose result the job row holds."""
    if stage is Stage.INIT:
        return completions.StageOutput(init_state={"by": tag})
    if stage is Stage.RUN:
        trajectory = TrajectoryData(token_ids=[5, 6], logprobs=[0.0, -0.5], loss_mask=[0, 1])
        return completions.StageOutput(run_result=RunResult(trajectory=trajectory, state={"by": tag}))
    return completions.StageOutput(eval_result=EvalResult(reward=0.5))


def claimed(sessions: Sessions, job_id: int, stage: Stage, attempt: int, now: datetime) -> claims.Claim:
    """The claim a worker holds (attempt ``attempt`` of ``stage``), as the claim would have made it."""
    with sessions() as s:
        batch_id = s.get_one(Job, job_id).batch_id
    return claims.Claim(
        job_id=job_id,
        stage=stage,
        attempt=attempt,
        batch_id=batch_id,
        node=NODE,
        started_at=now - timedelta(seconds=5),
        stage_data={"state": {"at": "start"}},
        created_at=now - timedelta(seconds=60),
    )


def complete(
    sessions: Sessions, claim: claims.Claim, worker: str, output: completions.StageOutput
) -> completions.Completion:
    now = utcnow()
    with transaction(sessions) as s:
        return completions.complete_stage(
            s.connection(), claim, output, worker=worker, now=now, owed_until=now + timedelta(seconds=LEASE_S)
        )


@pytest.mark.parametrize(("stage", "at"), COMPLETIONS, ids=[case_id(*c) for c in COMPLETIONS])
def test_completion_records_only_the_running_attempt_of_its_own_worker(
    machine: Sessions, jobs: Jobs, stage: Stage, at: At
) -> None:
    now = utcnow()
    job_id = job_at(jobs, at, now)
    before = row(machine, job_id)
    expected = completion_rule(stage, at)
    claim = claimed(machine, job_id, stage, 1, now)
    if expected == "claim lost":
        with pytest.raises(ClaimLost):
            complete(machine, claim, ME, output_of(stage, ME))
        assert row(machine, job_id) == before and runs(machine, job_id) == []
        return
    done = complete(machine, claim, ME, output_of(stage, ME))
    after = row(machine, job_id)
    if expected == "refused":
        assert not done.recorded and after == before and runs(machine, job_id) == []
        return
    assert done.recorded and after["stage_done"]
    assert runs(machine, job_id) == [(stage, at.stage_attempts, StageStatus.OK, ME)]
    if stage is Stage.EVAL:
        assert after["state"] is JobState.DONE and after["finish_seq"] is not None
    else:
        assert after["state"] is RUNNING[stage] and after["stage_data"]["state"]["by"] == ME


# --- the one-statement completion (PostgreSQL's usual path: complete_next) -------------------


def one_statement_rule(stage: Stage, at: At, dialect: str) -> bool:
    """The one statement records only exactly the attempt claimed, still running, of its worker;
    SQLite has no such statement (no writes in WITH), so there it records nothing."""
    owned = at.state is RUNNING[stage] and not at.stage_done and at.worker == ME and at.stage_attempts == 1
    return owned and dialect == "postgresql"


@pytest.mark.parametrize(("stage", "at"), COMPLETIONS, ids=[case_id(*c) for c in COMPLETIONS])
def test_one_statement_completion_writes_nothing_unless_it_owns_the_attempt(
    machine: Sessions, jobs: Jobs, stage: Stage, at: At
) -> None:
    now = utcnow()
    job_id = job_at(jobs, at, now)
    before = row(machine, job_id)
    claim = claimed(machine, job_id, stage, 1, now)
    with transaction(machine) as s:
        done = completions.complete_next(
            s.connection(), claim, output_of(stage, ME), worker=ME, now=now, owed_until=now
        )
    if not one_statement_rule(stage, at, machine.kw["bind"].dialect.name):
        assert done is None and row(machine, job_id) == before and runs(machine, job_id) == []
        return
    assert done is not None and done.recorded
    assert runs(machine, job_id) == [(stage, 1, StageStatus.OK, ME)]


# --- lease renewal and giving a stage back ---------------------------------------------------


def owns_rule(stage: Stage, at: At) -> bool:
    return at.state is RUNNING[stage] and not at.stage_done and at.worker == ME


OWNERSHIP = [
    (stage, At(state, done, worker))
    for stage, state, done, worker in itertools.product(STAGES, STATES, (True, False), (ME, OTHER, None))
]


@pytest.mark.parametrize(("stage", "at"), OWNERSHIP, ids=[case_id(*c) for c in OWNERSHIP])
def test_renew_and_retry_act_only_on_a_stage_the_worker_owns(
    machine: Sessions, jobs: Jobs, stage: Stage, at: At
) -> None:
    now = utcnow()
    job_id = job_at(jobs, at, now)
    before = row(machine, job_id)
    until = now + timedelta(seconds=2 * LEASE_S)
    with transaction(machine) as s:
        kept = lifecycle.renew_leases(s.connection(), job_ids=[job_id], worker=ME, until=until)
    assert (kept == {job_id}) is (at.state in RUNNING.values() and not at.stage_done and at.worker == ME)
    if not kept:
        assert row(machine, job_id) == before
    if at.state is PREVIOUS[stage] and at.stage_done:
        return  # the claim was lost: see test_completion_records_only_the_running_attempt_of_its_own_worker
    with transaction(machine) as s:
        task_id = lifecycle.retry_stage(
            s.connection(), job_id=job_id, stage=stage, worker=ME, now=now, error="boom", resend_until=now
        )
    assert (task_id is not None) is owns_rule(stage, at)
    if task_id is None:
        assert row(machine, job_id)["worker"] == before["worker"]
    else:
        assert row(machine, job_id)["worker"] is None
        assert runs(machine, job_id) == [(stage, 1, StageStatus.RETRY, ME)]


# --- what a table cannot show ----------------------------------------------------------------


def claim(sessions: Sessions, job_id: int, stage: Stage, *, worker: str, node: str) -> claims.Claim:
    with transaction(sessions) as s:
        return claims.claim_stage(
            s.connection(),
            job_id=job_id,
            stage=stage,
            node=node,
            worker=worker,
            now=utcnow(),
            lease_s=LEASE_S,
            max_attempts=MAX_ATTEMPTS,
        )


def hand_on(sessions: Sessions, node: str) -> nodes.HandedOn:
    now = utcnow()
    with transaction(sessions) as s:
        return nodes.hand_on(
            s.connection(),
            node,
            now=now,
            seen_at=now - timedelta(seconds=300),
            restart=True,
            max_restarts=3,
            owed_until=now,
        )


@pytest.mark.parametrize("stage", [Stage.INIT, Stage.RUN])
def test_a_cut_off_workers_completion_after_a_node_hand_on_is_refused(machine: Sessions, stage: Stage) -> None:
    # Nodes of this test's own: the PostgreSQL database is shared by the session's tests.
    lost_node, new_node = f"lost-{uuid.uuid4().hex[:8]}", f"new-{uuid.uuid4().hex[:8]}"
    (job_id,) = new_jobs(machine, 1)
    # Given a job whose ``stage`` runs on a node that is then lost,
    if stage is Stage.RUN:
        assert complete(
            machine,
            claim(machine, job_id, Stage.INIT, worker="w-old", node=lost_node),
            "w-old",
            output_of(Stage.INIT, "old"),
        ).recorded
    cut_off = claim(machine, job_id, stage, worker="w-old", node=lost_node)
    assert cut_off.skip is None and cut_off.attempt == 1
    assert [j for j, _ in hand_on(machine, lost_node).restarted] == [job_id]
    # started over on another node, where a new worker's attempt has the same number,
    if stage is Stage.RUN:
        complete(
            machine,
            claim(machine, job_id, Stage.INIT, worker="w-new", node=new_node),
            "w-new",
            output_of(Stage.INIT, "new"),
        )
    taken = claim(machine, job_id, stage, worker="w-new", node=new_node)
    assert taken.skip is None and taken.attempt == cut_off.attempt
    # when the cut-off worker completes, its result is refused, and the new worker's stands.
    refused = complete(machine, cut_off, "w-old", output_of(stage, "old"))
    assert not refused.recorded and refused.reason is not None and "lease lost" in refused.reason
    assert complete(machine, taken, "w-new", output_of(stage, "new")).recorded
    after = row(machine, job_id)
    assert (after["state"], after["stage_done"], after["node"]) == (RUNNING[stage], True, new_node)
    assert after["stage_data"]["state"]["by"] == "new"
    attempts_of_stage = [r for r in runs(machine, job_id) if r[0] is stage]
    assert attempts_of_stage == [(stage, 1, StageStatus.LOST, "w-old"), (stage, 1, StageStatus.OK, "w-new")]


@pytest.mark.parametrize("stage", [Stage.RUN, Stage.EVAL])
def test_a_stage_cannot_be_claimed_while_the_one_before_runs(machine: Sessions, stage: Stage) -> None:
    (job_id,) = new_jobs(machine, 1)
    for earlier in STAGES[: STAGES.index(stage) - 1]:
        complete(machine, claim(machine, job_id, earlier, worker=ME, node=NODE), ME, output_of(earlier, ME))
    before = claim(machine, job_id, STAGES[STAGES.index(stage) - 1], worker=ME, node=NODE)
    assert before.skip is None
    early = claim(machine, job_id, stage, worker=OTHER, node=NODE)
    assert early.skip is not None and "not ready" in early.skip
    assert row(machine, job_id)["state"] is RUNNING[before.stage]


# --- the row types say what the statements return --------------------------------------------


def column_types(model: type, names: typing.Iterable[str]) -> dict[str, Any]:
    hints = typing.get_type_hints(model)
    return {name: typing.get_args(hints[name])[0] for name in names}


def test_job_row_types_name_the_columns_their_statements_return_with_the_models_types() -> None:
    job_columns = [c.name for c in sql.JOB_COLUMNS]
    assert typing.get_type_hints(jobrows.JobRow) == column_types(Job, job_columns)
    assert list(sql.LOCK_JOB.selected_columns.keys()) == job_columns
    task = {
        **column_types(Job, job_columns),
        **column_types(Group, ["config"]),
        **column_types(Batch, ["sampling", "history", "limits", "quorum"]),
    }
    assert typing.get_type_hints(jobrows.TaskJobRow) == task
    assert list(sql.LOCK_JOB_WITH_TASK.selected_columns.keys()) == list(task)
    granted = typing.get_type_hints(jobrows.GrantedRow)
    assert granted == {name: task[name] for name in granted}
    for stage in Stage:
        returned = list(sql.CLAIM_NEXT[stage].exported_columns.keys())
        arrays = list(sql.TRAJECTORY_ARRAYS) if stage is Stage.EVAL else []
        assert returned == [*granted, *arrays]
    assert typing.get_type_hints(attempts.TrajectoryArrays) == column_types(Trajectory, sql.TRAJECTORY_ARRAYS)
    assert list(sql.LOAD_TRAJECTORY.selected_columns.keys()) == list(sql.TRAJECTORY_ARRAYS)
