"""The rows an attempt at a stage leaves besides the job row: its ``stage_runs`` row, written
once when it ends, and RUN's trajectory (which EVAL reads back)."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any, Protocol

import numpy as np
from sqlalchemy import Connection

from farm.constants import Stage, StageStatus
from farm.db.arrays import (
    FLOAT32,
    pack_ids,
    pack_logprobs,
    pack_mask,
    pack_segments,
    segment_data,
    unpack_ids,
    unpack_segments,
)
from farm.db.base import utcnow
from farm.db.jobs import statements as sql
from farm.db.jobs.jobrows import JobRow
from farm.schemas import EvalResult, RunResult, TrajectoryData


class TrajectoryArrays(Protocol):
    """A row with RUN's episode packed (``sql.TRAJECTORY_ARRAYS``; see ``jobrows`` on row types)."""

    token_ids: bytes
    logprobs: bytes
    loss_mask: bytes
    turn_offsets: bytes
    weight_versions: list[list[int]]
    segments: bytes | None
    info: dict[str, Any]


@dataclass
class Writes:
    """The rows a completion writes besides the job's: its attempt, RUN's trajectory, EVAL's score."""

    attempt: dict[str, Any]
    trajectory: dict[str, Any] | None
    score: dict[str, Any] | None


def attempt_row(
    *,
    job_id: int,
    stage: Stage,
    attempt: int,
    status: StageStatus,
    node: str | None,
    worker: str | None,
    started_at: datetime | None,
    now: datetime,
    error: str | None = None,
) -> dict[str, Any]:
    """The stage_runs row of an attempt that ends now."""
    return {
        "job_id": job_id,
        "stage": stage,
        "attempt": attempt,
        "status": status,
        "node": node,
        "worker": worker,
        "started_at": started_at or now,
        "finished_at": now,
        "error": error,
    }


def record_unfinished(session: Connection, job: JobRow, status: StageStatus, now: datetime, error: str | None) -> None:
    """Record the attempt in progress on a locked job row, found ended by someone other than its
    worker (lost, cancelled) or given up by it (retry, error); a job between attempts gets no row."""
    if job.stage_started_at is None or job.state not in sql.STATE_STAGE:
        return
    row = attempt_row(
        job_id=job.id,
        stage=sql.STATE_STAGE[job.state],
        attempt=job.stage_attempts,
        status=status,
        node=job.node,
        worker=job.worker,
        started_at=job.stage_started_at,
        now=now,
        error=error,
    )
    session.execute(sql.INSERT_RUN, row)


def trajectory_row(result: RunResult) -> dict[str, Any]:
    """RUN's trajectory row, without its job id."""
    t = result.trajectory
    return {
        "created_at": utcnow(),
        "num_tokens": len(t.token_ids),
        "token_ids": pack_ids(t.token_ids),
        "logprobs": pack_logprobs(t.logprobs),
        "loss_mask": pack_mask(t.loss_mask),
        "turn_offsets": pack_ids(t.turn_offsets),
        "weight_versions": [list(span) for span in t.weight_versions],
        "segments": pack_segments(t.segments),
        "info": dict(t.info),
        "reward": None,
        "metrics": {},
        "timings": {},
    }


def score_row(eval_result: EvalResult, timings: dict[str, float]) -> dict[str, Any]:
    """What EVAL adds to the trajectory row."""
    return {
        "reward": eval_result.reward,
        "metrics": dict(eval_result.metrics),
        "info": dict(eval_result.info),
        "timings": timings,
    }


def write_apart(session: Connection, job_id: int, writes: Writes) -> None:
    """A completion's other rows, one statement per table (SQLite, and the locking path)."""
    session.execute(sql.INSERT_RUN, writes.attempt)
    if writes.trajectory is not None:
        session.execute(sql.upsert_trajectory(session.dialect.name), {"job_id": job_id, **writes.trajectory})
    if writes.score is not None:
        session.execute(sql.SCORE_TRAJECTORY, {"_job_id": job_id, **writes.score})


def save_trajectory(session: Connection, job_id: int, result: RunResult) -> None:
    """Insert RUN's trajectory, or overwrite the one an earlier attempt left."""
    session.execute(sql.upsert_trajectory(session.dialect.name), {"job_id": job_id, **trajectory_row(result)})


def load_trajectory(session: Connection, job_id: int) -> TrajectoryData | None:
    row = session.execute(sql.LOAD_TRAJECTORY, {"job_id": job_id}).one_or_none()
    return None if row is None else unpack_trajectory(row)


def unpack_trajectory(row: TrajectoryArrays) -> TrajectoryData:
    """A trajectory from a row with its packed arrays (see ``sql.TRAJECTORY_ARRAYS``)."""
    return TrajectoryData(
        token_ids=unpack_ids(row.token_ids),
        logprobs=np.frombuffer(row.logprobs, dtype=FLOAT32).tolist(),
        loss_mask=list(row.loss_mask),
        turn_offsets=unpack_ids(row.turn_offsets),
        weight_versions=[tuple(span) for span in row.weight_versions or []],
        info=dict(row.info),
        segments=[segment_data(s) for s in unpack_segments(row.segments)],
    )
