"""New jobs: the one builder of the rows a group's samples start as.

A batch's groups all get their jobs at submit (``farm.db.batches``); a dynamic batch's get theirs
when the pool starts them (``farm.db.dynamic``). Either way each job is queued, owed its INIT from
the commit on (the reconciler sends it at ``owed_until`` if no worker claimed it by then), and has
a seed derived from the batch's.
"""

from __future__ import annotations

import secrets
from collections.abc import Sequence
from datetime import datetime

from sqlalchemy import insert
from sqlalchemy.orm import Session

from farm.constants import JobState
from farm.db.jobs.statements import JOBS

#: job seeds stay below 2**31 so every backend (and numpy) accepts them.
SEED_MODULUS = 2**31 - 1


def job_seed(base: int | None, ordinal: int) -> int:
    """The seed of a batch's ``ordinal``-th sample (group index x group size + sample index):
    derived from the batch's seed when the trainer set one, else random."""
    if base is None:
        return secrets.randbelow(SEED_MODULUS)
    return (base * 1_000_003 + ordinal) % SEED_MODULUS


def insert_jobs(
    session: Session,
    *,
    batch_id: int,
    groups: Sequence[tuple[int, int, str]],
    group_size: int,
    seed: int | None,
    now: datetime,
    owed_until: datetime,
) -> list[tuple[int, str | None]]:
    """Insert ``group_size`` jobs for each of ``groups`` (group id, its index in the batch, task type)
    in one multi-row INSERT (ORM objects for every job cost more than writing the rows); returns
    each job's (id, Celery task id) in order."""
    rows = [
        {
            "batch_id": batch_id,
            "group_id": group_id,
            "group_index": index,
            "sample_index": k,
            "type": task_type,
            "seed": job_seed(seed, index * group_size + k),
            "state": JobState.QUEUED,
            "stage_done": True,
            "attempts": 0,
            "stage_attempts": 0,
            "stage_data": {},
            "created_at": now,
            "lease_until": owed_until,
            "task_id": secrets.token_hex(16),
        }
        for group_id, index, task_type in groups
        for k in range(group_size)
    ]
    made = session.execute(insert(JOBS).returning(JOBS.c.id, JOBS.c.task_id, sort_by_parameter_order=True), rows)
    return [(row.id, row.task_id) for row in made]
