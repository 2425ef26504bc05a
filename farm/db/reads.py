"""Reads: a batch's status, its jobs and trajectories, and the pages of results and groups the API
serves (creating a batch is ``farm.db.batches``)."""

from __future__ import annotations

import functools
import json
from datetime import UTC
from types import SimpleNamespace
from typing import TYPE_CHECKING, Any, NamedTuple

import pydantic_core
from sqlalchemy import func, select
from sqlalchemy.orm import Session, selectinload

from farm.constants import BatchState, JobState, Stage, StageStatus
from farm.db import dynamic
from farm.db.arrays import PackedSegment, encode_ids, encode_logprobs, encode_mask, unpack_ids, unpack_segments
from farm.db.base import utcnow
from farm.db.models import Batch, Group, Job, Trajectory
from farm.errors import BatchNotFound, Conflict, JobNotFound, TrajectoryNotFound
from farm.schemas import (
    ArrayEncoding,
    BatchLimits,
    BatchStatus,
    DynamicStatus,
    GroupResult,
    GroupsPage,
    JobOut,
    JobResult,
    Quorum,
    Readiness,
    ResultsPage,
    StageRunOut,
    TrajectoryOut,
    TrajectorySegmentOut,
)

if TYPE_CHECKING:
    import psycopg

#: the stage a job in each of these states may be running.
_RUNNING_STAGE = {JobState.INIT: Stage.INIT, JobState.RUN: Stage.RUN, JobState.EVAL: Stage.EVAL}


def get_batch(session: Session, batch_id: int) -> Batch:
    batch = session.get(Batch, batch_id)
    if batch is None:
        raise BatchNotFound(f"no batch with id {batch_id}")
    return batch


def batch_status(session: Session, batch_id: int) -> BatchStatus:
    batch = get_batch(session, batch_id)
    counts = {state: 0 for state in JobState}
    for state, count in session.execute(
        select(Job.state, func.count()).where(Job.batch_id == batch_id).group_by(Job.state)
    ):
        counts[state] = count
    outcomes = {
        outcome: count
        for outcome, count in session.execute(
            select(Job.outcome, func.count())
            .where(Job.batch_id == batch_id, Job.finish_seq.is_not(None))
            .group_by(Job.outcome)
        )
        if outcome is not None
    }
    reward_sum, scored = session.execute(
        select(func.sum(Job.reward), func.count(Job.reward)).where(Job.batch_id == batch_id)
    ).one()
    elapsed_s = _elapsed_s(batch)
    left = batch.total_jobs - batch.finished_jobs
    eta_s = None
    if batch.state is BatchState.RUNNING and batch.finished_jobs and elapsed_s > 0:
        eta_s = left * elapsed_s / batch.finished_jobs
    return BatchStatus(
        reward_mean=float(reward_sum or 0.0) / scored if scored else None,
        scored=scored,
        eta_s=eta_s,
        elapsed_s=max(0.0, elapsed_s),
        id=batch.id,
        state=batch.state,
        created_at=batch.created_at,
        finished_at=batch.finished_at,
        group_size=batch.group_size,
        total_jobs=batch.total_jobs,
        finished_jobs=batch.finished_jobs,
        counts=counts,
        outcomes=outcomes,
        metadata=batch.meta,
        history=batch.history,
        dynamic=_dynamic_status(session, batch) if batch.dynamic is not None else None,
        limits=None if batch.limits is None else BatchLimits.model_validate(batch.limits),
        readiness=readiness(batch),
    )


def readiness(batch: Batch) -> Readiness | None:
    """Where a batch with a quorum stands: every job past its ready_seq was carried or cut (the cut
    is in the commit that made it ready), so the batch row says it all."""
    if batch.quorum is None:
        return None
    quorum = Quorum.model_validate(batch.quorum)
    ready_at, reason, ready_seq = batch.ready_at, batch.ready_reason, batch.ready_seq
    if ready_at is None and batch.state is BatchState.COMPLETE:
        # Its last jobs ended before a worker settled it (moments, or a crash, until the sweeper
        # does): every job finished, so its quorum is met, and the settle will say the same.
        ready_at, reason, ready_seq = batch.finished_at, "quorum", batch.finished_jobs
    past = 0 if ready_seq is None else batch.total_jobs - ready_seq
    return Readiness(
        ready=ready_at is not None,
        reason=reason,
        ready_at=ready_at,
        ready_seq=ready_seq,
        needed=quorum.needed(batch.total_jobs),
        rest=quorum.rest,
        carried=past if quorum.rest == "carry" else 0,
        cut=past if quorum.rest == "cancel" else 0,
    )


def _elapsed_s(batch: Batch) -> float:
    """Seconds the batch has run: from its enqueueing (else creation) to its end, or to now."""
    start = batch.enqueued_at or batch.created_at
    return ((batch.finished_at or utcnow()) - start).total_seconds()


def _dynamic_status(session: Session, batch: Batch) -> DynamicStatus:
    running = session.scalar(select(func.count()).where(Group.batch_id == batch.id, Group.state == "running"))
    pool = session.scalar(select(func.count()).where(Group.batch_id == batch.id))
    return DynamicStatus(
        target_groups=dynamic.options_of(batch).target_groups,
        pool=int(pool or 0),
        started=batch.groups_started,
        running=int(running or 0),
        informative=batch.groups_informative,
        uninformative=batch.groups_uninformative,
        failed=batch.groups_failed,
        skipped=batch.groups_skipped,
        end_reason=batch.end_reason,
    )


def stage_history(job: Job) -> list[StageRunOut]:
    """Every attempt at the job's stages in order: the finished ones from their rows, then the
    one in progress, which has no row until it ends."""
    history = [
        StageRunOut(
            stage=r.stage,
            attempt=r.attempt,
            status=r.status,
            node=r.node,
            worker=r.worker,
            started_at=r.started_at,
            finished_at=r.finished_at,
            error=r.error,
        )
        for r in job.stages
    ]
    if job.stage_started_at is not None and job.state in _RUNNING_STAGE:
        history.append(
            StageRunOut(
                stage=_RUNNING_STAGE[job.state],
                attempt=job.stage_attempts,
                status=StageStatus.RUNNING,
                node=job.node,
                worker=job.worker,
                started_at=job.stage_started_at,
                finished_at=None,
                error=None,
            )
        )
    return history


def job_out(job: Job, *, with_stages: bool) -> JobOut:
    stages = stage_history(job) if with_stages else []
    return JobOut(
        id=job.id,
        batch_id=job.batch_id,
        group_id=job.group_id,
        group_index=job.group_index,
        sample_index=job.sample_index,
        type=job.type,
        state=job.state,
        outcome=job.outcome,
        reason=job.reason,
        attempts=job.attempts,
        node=job.node,
        reward=job.reward,
        stale=job.stale,
        created_at=job.created_at,
        init_at=job.init_at,
        run_at=job.run_at,
        eval_at=job.eval_at,
        finished_at=job.finished_at,
        stages=stages,
    )


def get_job(session: Session, job_id: int) -> JobOut:
    job = session.get(Job, job_id, options=[selectinload(Job.stages)])
    if job is None:
        raise JobNotFound(f"no job with id {job_id}")
    return job_out(job, with_stages=True)


_TRAJECTORY_COLUMNS = (
    "job_id",
    "num_tokens",
    "token_ids",
    "logprobs",
    "loss_mask",
    "turn_offsets",
    "weight_versions",
    "segments",
    "reward",
    "metrics",
    "timings",
    "info",
)


def _json_loads(data: str | bytes) -> Any:
    try:
        return pydantic_core.from_json(data)
    except ValueError:
        # What pydantic-core refuses and the json module takes (a lone surrogate escape, which a
        # json column keeps as it was written).
        return json.loads(data)


@functools.cache
def _bytea_view_loader() -> type[psycopg.adapt.Loader]:
    import psycopg

    class ByteaView(psycopg.adapt.Loader):
        """bytea in binary format as a view of the result's memory, which the view keeps alive."""

        format = psycopg.pq.Format.BINARY

        def load(self, data: psycopg.abc.Buffer) -> psycopg.abc.Buffer:
            return data

    return ByteaView


def _binary_cursor(session: Session) -> psycopg.Cursor[tuple[Any, ...]]:
    """A psycopg cursor on the session's connection that reads results in binary format: bytea
    in text format arrives hex-encoded, and decoding it costs ~6x the whole read. Its bytea values
    are read-only memoryviews of the result (psycopg's own loader copies each into bytes: pages
    of megabytes, sent on as they are) and its json values are parsed by pydantic-core (~2x the
    json module's speed)."""
    from psycopg.types.json import set_json_loads

    raw = session.connection().connection.driver_connection
    assert raw is not None
    cursor: psycopg.Cursor[tuple[Any, ...]] = raw.cursor(binary=True)
    cursor.adapters.register_loader("bytea", _bytea_view_loader())
    set_json_loads(_json_loads, cursor)
    return cursor


def trajectory_out(traj: Any, job: Job | JobOut, encoding: ArrayEncoding) -> TrajectoryOut:
    return TrajectoryOut(
        job_id=job.id,
        batch_id=job.batch_id,
        group_id=job.group_id,
        encoding=encoding,
        num_tokens=traj.num_tokens,
        token_ids=encode_ids(traj.token_ids, encoding),
        logprobs=encode_logprobs(traj.logprobs, encoding),
        loss_mask=encode_mask(traj.loss_mask, encoding),
        turn_offsets=unpack_ids(traj.turn_offsets),
        weight_versions=[tuple(span) for span in traj.weight_versions or []],
        reward=traj.reward,
        metrics=traj.metrics,
        timings=traj.timings,
        info=traj.info,
        segments=[_segment_out(s, encoding) for s in unpack_segments(traj.segments)],
    )


def _segment_out(s: PackedSegment, encoding: ArrayEncoding) -> TrajectorySegmentOut:
    return TrajectorySegmentOut(
        num_tokens=len(s.loss_mask),
        token_ids=encode_ids(s.token_ids, encoding),
        logprobs=encode_logprobs(s.logprobs, encoding),
        loss_mask=encode_mask(s.loss_mask, encoding),
        turn_offsets=s.turn_offsets,
        weight_versions=[(v, start, end) for v, start, end in s.weight_versions],
    )


def get_trajectory(session: Session, job_id: int, encoding: ArrayEncoding) -> TrajectoryOut:
    job = session.get(Job, job_id)
    if job is None:
        raise JobNotFound(f"no job with id {job_id}")
    traj = session.get(Trajectory, job_id)
    if traj is None:
        raise TrajectoryNotFound(f"job {job_id} has no trajectory (state {job.state.value})")
    return trajectory_out(traj, job, encoding)


class ResultRows(NamedTuple):
    """A results page as the database holds it: the batch's state, how many of its jobs have not
    finished and how many have, and each finished job past the cursor as (finish position, job,
    trajectory row or None); a trajectory row has the attributes of ``Trajectory`` that
    ``_TRAJECTORY_COLUMNS`` name."""

    state: BatchState
    remaining: int
    finished: int
    items: list[tuple[int, JobOut, Any]]
    #: a batch with a quorum, once ready: its step's last finish position.
    ready_seq: int | None = None


#: the columns of a job that ``JobOut`` shows (its ``stages`` aside), in its field order.
_JOB_OUT_COLUMNS = tuple(name for name in JobOut.model_fields if name != "stages")
_JOB_TIMES = ("created_at", "init_at", "run_at", "eval_at", "finished_at")
#: the page in one statement: the batch (no row: no such batch), its jobs past the cursor (none:
#: one row of NULLs) and the trajectories of the done ones when asked for.
_RESULTS_PAGE_SQL = f"""
SELECT b.state, b.total_jobs - b.finished_jobs, b.finished_jobs,
    COALESCE(b.ready_seq, CASE WHEN b.quorum IS NOT NULL AND b.state = '{BatchState.COMPLETE.value}'
        THEN b.finished_jobs END),
    j.finish_seq, {", ".join(f"j.{c}" for c in _JOB_OUT_COLUMNS)},
    {", ".join(f"t.{c}" for c in _TRAJECTORY_COLUMNS)}
FROM batches b
LEFT JOIN LATERAL (
    SELECT finish_seq, {", ".join(_JOB_OUT_COLUMNS)} FROM jobs
    WHERE jobs.batch_id = b.id AND jobs.finish_seq > %(after)s ORDER BY jobs.finish_seq LIMIT %(limit)s
) j ON true
LEFT JOIN trajectories t ON %(trajectories)s AND j.state = '{JobState.DONE.value}' AND t.job_id = j.id
WHERE b.id = %(batch_id)s
ORDER BY j.finish_seq
"""


def results_rows(session: Session, batch_id: int, *, after: int, limit: int, trajectories: bool) -> ResultRows:
    """The batch's finished jobs after cursor ``after`` in finish order, with the trajectory rows
    of the done ones (none unless ``trajectories``).

    Raises:
        BatchNotFound: no batch ``batch_id``.
    """
    if session.get_bind().dialect.name == "postgresql":
        return _results_rows_pg(session, batch_id, after=after, limit=limit, trajectories=trajectories)
    batch = get_batch(session, batch_id)
    jobs = list(
        session.scalars(
            select(Job).where(Job.batch_id == batch_id, Job.finish_seq > after).order_by(Job.finish_seq).limit(limit)
        )
    )
    done = [j.id for j in jobs if j.state is JobState.DONE] if trajectories else []
    trajs: dict[int, Trajectory] = {}
    if done:
        trajs = {t.job_id: t for t in session.scalars(select(Trajectory).where(Trajectory.job_id.in_(done)))}
    items = [(job.finish_seq or 0, job_out(job, with_stages=False), trajs.get(job.id)) for job in jobs]
    ready = readiness(batch)
    ready_seq = None if ready is None else ready.ready_seq
    return ResultRows(batch.state, batch.total_jobs - batch.finished_jobs, batch.finished_jobs, items, ready_seq)


def _results_rows_pg(session: Session, batch_id: int, *, after: int, limit: int, trajectories: bool) -> ResultRows:
    """``results_rows`` in one statement, read with a binary cursor, no ORM objects: the API
    serves pages of megabytes, and three queries' round trips and ORM loading were a fifth of
    its work per page."""
    params = {"batch_id": batch_id, "after": after, "limit": limit, "trajectories": trajectories}
    with _binary_cursor(session) as cursor:
        rows = cursor.execute(_RESULTS_PAGE_SQL, params).fetchall()
    if not rows:
        raise BatchNotFound(f"no batch with id {batch_id}")
    jobs_end = 5 + len(_JOB_OUT_COLUMNS)
    items = []
    for row in rows:
        if row[4] is None:  # the batch's row, with no job past the cursor
            break
        job = dict(zip(_JOB_OUT_COLUMNS, row[5:jobs_end], strict=True))
        for name in _JOB_TIMES:
            if job[name] is not None:
                job[name] = job[name].astimezone(UTC)  # in the session's time zone, as PostgreSQL sent it
        traj = row[jobs_end:]
        items.append(
            (
                row[4],
                JobOut.model_validate(job),
                None if traj[0] is None else SimpleNamespace(**dict(zip(_TRAJECTORY_COLUMNS, traj, strict=True))),
            )
        )
    return ResultRows(BatchState(rows[0][0]), rows[0][1], rows[0][2], items, rows[0][3])


def results_page(
    session: Session, batch_id: int, *, after: int, limit: int, encoding: ArrayEncoding, trajectories: bool
) -> ResultsPage:
    """Finished jobs of a batch in finish order, after cursor ``after``."""
    state, remaining, finished, rows, ready_seq = results_rows(
        session, batch_id, after=after, limit=limit, trajectories=trajectories
    )
    items = [
        JobResult(
            seq=seq,
            job=job,
            trajectory=None if traj is None else trajectory_out(traj, job, encoding),
        )
        for seq, job, traj in rows
    ]
    return ResultsPage(
        items=items,
        next_cursor=items[-1].seq if items else after,
        batch_state=state,
        remaining=remaining,
        finished=finished,
        ready_seq=ready_seq,
    )


def summary_counts(session: Session) -> dict[str, Any]:
    """Jobs per state over every running batch (for /metrics)."""
    rows = session.execute(
        select(Job.state, func.count())
        .join(Batch, Batch.id == Job.batch_id)
        .where(Batch.state == BatchState.RUNNING)
        .group_by(Job.state)
    )
    return {state.value: count for state, count in rows}


def groups_page(session: Session, batch_id: int, *, after: int, limit: int, encoding: ArrayEncoding) -> GroupsPage:
    """A dynamic batch's informative groups past cursor ``after``, in the order they were found, each
    with every sample's result (trajectories of the done ones).

    Raises:
        BatchNotFound: no batch ``batch_id``.
        Conflict: the batch is not dynamic (its results are per job: ``results_page``).
    """
    batch = get_batch(session, batch_id)
    if batch.dynamic is None:
        raise Conflict(f"batch {batch_id} is not a dynamic batch: read its results per job (/results)")
    groups = session.scalars(
        select(Group)
        .where(Group.batch_id == batch_id, Group.result_seq > after)
        .order_by(Group.result_seq)
        .limit(limit)
    ).all()
    items = []
    for group in groups:
        jobs = session.scalars(select(Job).where(Job.group_id == group.id).order_by(Job.sample_index)).all()
        done = [j.id for j in jobs if j.state is JobState.DONE]
        trajs = {t.job_id: t for t in session.scalars(select(Trajectory).where(Trajectory.job_id.in_(done)))}
        results = [
            JobResult(
                seq=job.finish_seq or 0,
                job=(out := job_out(job, with_stages=False)),
                trajectory=trajectory_out(trajs[job.id], out, encoding) if job.id in trajs else None,
            )
            for job in jobs
        ]
        rewards = [float(r.job.reward) for r in results if r.job.reward is not None]
        assert group.result_seq is not None
        items.append(
            GroupResult(
                seq=group.result_seq,
                group_id=group.id,
                index=group.index,
                name=group.name,
                reward_mean=group.reward_mean or 0.0,
                reward_std=group.reward_std or 0.0,
                rewards=rewards,
                results=results,
            )
        )
    return GroupsPage(
        items=items,
        next_cursor=items[-1].seq if items else after,
        batch_state=batch.state,
        informative=batch.groups_informative,
        target_groups=dynamic.options_of(batch).target_groups,
        end_reason=batch.end_reason,
    )
