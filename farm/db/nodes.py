"""Nodes' signs of life, and what happens to the jobs of a node that is gone.

A job past INIT lives on its node: its sandbox is there, and its RUN and EVAL go to that node's
queues. Every worker process writes its node's ``seen_at`` each sweep interval; when no process
of a node has for ``worker.node_lost_s``, the node is lost, and its jobs past INIT either start
over from INIT on whichever node takes them, or end ``failed`` (``infra_error``, "node lost"),
as ``worker.on_node_lost`` says. Never left owed to a queue nobody reads.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from sqlalchemy import Connection, case, select, update
from sqlalchemy.dialects.postgresql import insert as pg_insert
from sqlalchemy.dialects.sqlite import insert as sqlite_insert

from farm.constants import BatchState, JobState, Outcome, StageStatus
from farm.db import teardowns
from farm.db.jobs import attempts, jobrows
from farm.db.jobs import statements as sql
from farm.db.models import Batch, Job, Node


def _insert(conn: Connection) -> Any:
    return (pg_insert if conn.dialect.name == "postgresql" else sqlite_insert)(Node)


def heartbeat(conn: Connection, node: str, *, now: datetime, gap_since: datetime) -> datetime:
    """This node is alive now; returns since when it has been without a gap (a report older
    than ``gap_since`` before this one starts a new run). The row is locked until commit."""
    statement = _insert(conn).values(name=node, seen_at=now, beating_since=now, lost_at=None)
    statement = statement.on_conflict_do_update(
        index_elements=[Node.name],
        set_={
            "seen_at": now,
            "lost_at": None,
            "beating_since": case((Node.seen_at < gap_since, now), else_=Node.beating_since),
        },
    )
    conn.execute(statement)
    since: datetime = conn.execute(select(Node.beating_since).where(Node.name == node)).scalar_one()
    return since


def lost(conn: Connection, *, now: datetime, silent_since: datetime) -> list[tuple[str, datetime]]:
    """Nodes holding unfinished jobs past INIT that nobody has heard from since ``silent_since``:
    (name, last seen). A node holding such jobs that never reported (a farm upgraded from before
    heartbeats) is given a report now, so it too gets the whole bound to speak up."""
    running = select(Batch.id).where(Batch.state == BatchState.RUNNING)
    holding = set(
        conn.execute(
            select(Job.node)
            .where(Job.batch_id.in_(running), Job.state.in_(list(sql.STATE_STAGE)), Job.node.is_not(None))
            .distinct()
        ).scalars()
    )
    if not holding:
        return []
    seen: dict[str, datetime] = {
        row.name: row.seen_at for row in conn.execute(select(Node.name, Node.seen_at).where(Node.name.in_(holding)))
    }
    for name in holding - set(seen):
        first = _insert(conn).values(name=name, seen_at=now, beating_since=now)
        conn.execute(first.on_conflict_do_nothing(index_elements=[Node.name]))
    return sorted((name, at) for name, at in seen.items() if at < silent_since)


@dataclass
class HandedOn:
    """What became of a lost node's jobs: INITs to send (job id, task id), and batches to wake."""

    restarted: list[tuple[int, str]] = field(default_factory=list)
    failed: int = 0
    batches: set[int] = field(default_factory=set)


def hand_on(
    conn: Connection,
    node: str,
    *,
    now: datetime,
    seen_at: datetime,
    restart: bool,
    max_restarts: int,
    owed_until: datetime,
) -> HandedOn:
    """Restart (or fail, unless ``restart``) every unfinished job past INIT on ``node``, which is
    lost; a job whose INIT was running there starts again either way."""
    running = select(Batch.id).where(Batch.state == BatchState.RUNNING)
    jobs = conn.execute(
        select(*sql.JOB_COLUMNS)
        .where(Job.batch_id.in_(running), Job.node == node, Job.state.in_(list(sql.STATE_STAGE)))
        .order_by(Job.id)
        .with_for_update(skip_locked=True)
    ).all()
    out = HandedOn()
    why = f"node lost: no worker on {node} seen since {seen_at.isoformat(timespec='seconds')}"
    for job in jobs:
        attempts.record_unfinished(conn, job, StageStatus.LOST, now, why)
        out.batches.add(job.batch_id)
        # A job whose INIT was still running there is not past INIT: it simply starts again.
        past_init = not (job.state is JobState.INIT and not job.stage_done)
        if (restart or not past_init) and job.restarts < max_restarts:
            task_id = uuid.uuid4().hex
            values = jobrows.move(job.id, job.state, JobState.QUEUED, now)
            jobrows.set_values(
                conn,
                job.id,
                **values,
                stage_done=True,
                node=None,
                worker=None,
                stage_attempts=0,
                stage_started_at=None,
                stage_data={},
                outcome=None,
                reason=None,
                restarts=job.restarts + 1,
                lease_until=owed_until,
                task_id=task_id,
            )
            out.restarted.append((job.id, task_id))
        else:
            reason = why if not restart else f"{why} (started over {job.restarts} times already)"
            jobrows.finish(conn, job, JobState.FAILED, now=now, outcome=Outcome.INFRA_ERROR, reason=reason)
            out.failed += 1
    teardowns.drop_node(conn, node)
    conn.execute(update(Node).where(Node.name == node).values(lost_at=now))
    return out
