"""Dynamic batches (DAPO) as rows: the pool, groups started from it, each group's verdict, the stop.

A dynamic batch's tasks are a pool: every task is a group row from submit on (``pending``), but a
group gets its jobs only when it starts. At most ``max_groups_in_flight`` groups run at once. When a
group's last job ends, ``settle_group`` decides it in one transaction, under the group's row lock:
its scored rewards go through the filter (``informative`` / ``uninformative``; ``failed`` with fewer
than two scored samples), the pass-rate ledger counts its samples, the batch's counters move in one
``UPDATE ... RETURNING`` (which also hands an informative group its place in the group results), and
the groups that replace it start (their jobs are inserted owed their INIT, as at submit). So each
group is counted exactly once, and the next prompt starts in the commit that decides the last one.

When the informative count reaches the target, or the pool is spent with nothing running, the same
commit sets ``end_reason``: the batch owes a stop. ``stop_batch`` pays it (every unfinished job
cancelled with that reason, running groups ``stopped``, the batch ``complete``); the worker that
decided calls it at once, and the sweeper's ``redrive`` calls it (and decides any group whose jobs
all ended but that nobody decided, after a crash between the two commits) every interval.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime

from sqlalchemy import Connection, func, insert, select, update
from sqlalchemy.orm import Session

from farm.constants import POLICY_OUTCOMES, TERMINAL_STATES, BatchState, JobState
from farm.db.jobs import lifecycle
from farm.db.models import Batch, Group, Job, PassRateRow
from farm.db.newjobs import insert_jobs
from farm.dynamic.filters import get_filter, spread
from farm.schemas import DynamicSampling, PassRate, TaskSpec, task_key


def options_of(batch: Batch) -> DynamicSampling:
    assert batch.dynamic is not None
    return DynamicSampling.model_validate(batch.dynamic)


def in_flight(options: DynamicSampling) -> int:
    return options.max_groups_in_flight or options.target_groups


def create_pool(session: Session, batch: Batch, tasks: list[TaskSpec]) -> None:
    """Every task of the pool as a pending group (no jobs yet)."""
    session.execute(
        insert(Group),
        [
            {"batch_id": batch.id, "index": i, "type": t.type, "config": t.config, "name": t.name, "state": "pending"}
            for i, t in enumerate(tasks)
        ],
    )


@dataclass
class Started:
    """What starting groups did: the jobs to send INIT to (after the commit)."""

    jobs: list[tuple[int, str | None]] = field(default_factory=list)
    groups: int = 0
    skipped: int = 0


def start_groups(session: Session, batch: Batch, slots: int, *, now: datetime, owed_until: datetime) -> Started:
    """Start up to ``slots`` groups from the pool (in order, past those the ledger says to skip).
    The caller holds the batch row (locked) and commits; the jobs are owed their INIT from then on."""
    options = options_of(batch)
    out = Started()
    n, seed = batch.group_size, batch.sampling.get("seed")
    while out.groups < slots:
        group = session.scalars(
            select(Group)
            .where(Group.batch_id == batch.id, Group.index >= batch.pool_cursor)
            .order_by(Group.index)
            .limit(1)
            .with_for_update()
        ).first()
        if group is None:
            break
        batch.pool_cursor = group.index + 1
        if options.skip is not None and _stuck(session, group, options):
            group.state, group.decided_at = "skipped", now
            batch.groups_skipped += 1
            out.skipped += 1
            continue
        out.jobs += insert_jobs(
            session,
            batch_id=batch.id,
            groups=[(group.id, group.index, group.type)],
            group_size=n,
            seed=seed,
            now=now,
            owed_until=owed_until,
        )
        group.state, group.started_at = "running", now
        batch.groups_started += 1
        out.groups += 1
    return out


def _stuck(session: Session, group: Group, options: DynamicSampling) -> bool:
    assert options.skip is not None
    row = session.get(PassRateRow, task_key(group.type, group.config, group.name))
    if row is None or row.tries < options.skip.after_tries:
        return False
    return row.successes in (0, row.tries)


@dataclass
class Settled:
    """What deciding a group did."""

    verdict: str | None = None
    started: Started = field(default_factory=Started)
    #: the batch now owes its stop (target reached, or pool spent with nothing running).
    ended: bool = False


def settle_group(session: Session, group_id: int, *, now: datetime, owed_until: datetime) -> Settled:
    """Decide the group if all its jobs have ended and nobody decided it yet (see the module docstring)."""
    group = session.scalars(select(Group).where(Group.id == group_id).with_for_update()).first()
    if group is None or group.state != "running":
        return Settled()
    jobs = session.execute(select(Job.state, Job.outcome, Job.reward).where(Job.group_id == group_id)).all()
    if any(job.state not in TERMINAL_STATES for job in jobs):
        return Settled()
    batch = session.scalars(select(Batch).where(Batch.id == group.batch_id).with_for_update()).one()
    options = options_of(batch)
    rewards = [
        float(job.reward)
        for job in jobs
        if job.state is JobState.DONE and job.reward is not None and job.outcome in POLICY_OUTCOMES
    ]
    if len(rewards) < 2:
        verdict = "failed"
        batch.groups_failed += 1
    elif get_filter(options.filter)(rewards, options):
        verdict = "informative"
        batch.groups_informative += 1
        group.result_seq = batch.groups_informative
    else:
        verdict = "uninformative"
        batch.groups_uninformative += 1
    group.state, group.decided_at = verdict, now
    if rewards:
        group.reward_mean, group.reward_std = spread(rewards)
        _count_pass_rate(session, group, rewards, options.success_at, now)
    out = Settled(verdict=verdict)
    if batch.end_reason is None and batch.state is BatchState.RUNNING:
        if batch.groups_informative >= options.target_groups:
            batch.end_reason = "target_reached"
        else:
            running = _running_groups(session, batch.id)
            out.started = start_groups(session, batch, in_flight(options) - running, now=now, owed_until=owed_until)
            if running + out.started.groups == 0:
                batch.end_reason = "pool_exhausted"
    out.ended = batch.end_reason is not None
    return out


def _running_groups(session: Session, batch_id: int) -> int:
    count = session.scalar(select(func.count()).where(Group.batch_id == batch_id, Group.state == "running"))
    return int(count or 0)


def _count_pass_rate(session: Session, group: Group, rewards: list[float], success_at: float, now: datetime) -> None:
    key = task_key(group.type, group.config, group.name)
    row = session.scalars(select(PassRateRow).where(PassRateRow.task_key == key).with_for_update()).first()
    successes = sum(r >= success_at for r in rewards)
    if row is None:
        session.add(PassRateRow(task_key=key, type=group.type, tries=len(rewards), successes=successes, updated_at=now))
    else:
        row.tries += len(rewards)
        row.successes += successes
        row.updated_at = now


def stop_batch(session: Session, batch_id: int, *, now: datetime, teardown_due: datetime) -> list[str]:
    """Pay a dynamic batch's owed stop: every unfinished job cancelled with the batch's end reason
    (their sandboxes owed a teardown), running groups ``stopped``, the batch ``complete``. Returns the
    Celery task ids to revoke. Does nothing unless the batch ended and is still running."""
    batch = session.get(Batch, batch_id)
    if batch is None or batch.end_reason is None or batch.state is not BatchState.RUNNING:
        return []
    reason = batch.end_reason
    session.execute(
        update(Group)
        .where(Group.batch_id == batch_id, Group.state == "running")
        .values(state="stopped", decided_at=now)
    )
    session.flush()
    conn: Connection = session.connection()
    return lifecycle.cancel_batch(
        conn, batch_id=batch_id, now=now, teardown_due=teardown_due, reason=reason, ends_as=BatchState.COMPLETE
    )


def unsettled(session: Session) -> tuple[list[int], list[int]]:
    """For the sweeper: running groups of running dynamic batches whose jobs have all ended (nobody
    decided them: a crash between the two commits), and dynamic batches that owe their stop."""
    batches = select(Batch.id).where(Batch.state == BatchState.RUNNING, Batch.dynamic.is_not(None))
    open_jobs = select(Job.id).where(Job.group_id == Group.id, Job.state.not_in(list(TERMINAL_STATES))).exists()
    groups = session.scalars(
        select(Group.id).where(Group.batch_id.in_(batches), Group.state == "running", ~open_jobs)
    ).all()
    owed = session.scalars(
        select(Batch.id).where(
            Batch.state == BatchState.RUNNING, Batch.dynamic.is_not(None), Batch.end_reason.is_not(None)
        )
    ).all()
    return list(groups), list(owed)


def pass_rates(session: Session, *, keys: list[str] | None, task_type: str | None, limit: int) -> list[PassRate]:
    query = select(PassRateRow).order_by(PassRateRow.task_key).limit(limit)
    if keys:
        query = query.where(PassRateRow.task_key.in_(keys))
    if task_type:
        query = query.where(PassRateRow.type == task_type)
    return [
        PassRate(
            task_key=row.task_key,
            type=row.type,
            tries=row.tries,
            successes=row.successes,
            rate=row.successes / row.tries if row.tries else 0.0,
        )
        for row in session.scalars(query)
    ]
