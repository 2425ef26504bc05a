"""A worker's part in batches' deadlines: settle a batch with a quorum when one of its jobs ends, and,
each sweep, end jobs past their limits and settle batches whose deadline passed (``farm.deadlines``
holds the rules; this module acts after each commit: revokes, cancel flags, long-poll wake-ups)."""

from __future__ import annotations

import logging
from datetime import timedelta

from celery import Celery

from farm.constants import batch_cancel_key, batch_events_channel
from farm.db.base import utcnow
from farm.deadlines import limits, ready
from farm.worker.app import FarmRuntime
from farm.worker.enqueue import revoke

log = logging.getLogger(__name__)

#: how long a cut's cancel flag lives in Redis (the database keeps the cut for good).
CANCEL_FLAG_TTL_S = 7 * 24 * 3600


def settle(rt: FarmRuntime, app: Celery, batch_id: int) -> ready.Settled | None:
    """Make the batch ready if it is (its rest cancelled in that commit, where it asked for that)."""
    now = utcnow()
    with rt.engine.begin() as conn:
        settled = ready.settle(
            conn, batch_id, now=now, teardown_due=now + timedelta(seconds=rt.settings.worker.lease_s)
        )
    if settled is None:
        return None
    log.info("batch %s ready (%s) at seq %s; rest %s", batch_id, settled.reason, settled.ready_seq, settled.rest)
    if settled.rest == "cancel":
        # Running stages of the cut jobs stop at their next turn (their model call is closed); the
        # database already says cancelled, so a lost flag only makes them stop at their next commit.
        rt.redis.set(batch_cancel_key(batch_id), 1, ex=CANCEL_FLAG_TTL_S)
        revoke(app, settled.revoke)
    _announce(rt, batch_id)
    return settled


def redrive(rt: FarmRuntime, app: Celery) -> int:
    """The sweeper's part: jobs past a limit ended (outcome timeout), batches made ready whose
    deadline passed or whose settle a crash left undone. Returns how many of each it acted on."""
    now = utcnow()
    with rt.engine.begin() as conn:
        ended = limits.end_overdue(
            conn, rt.settings.worker, now=now, teardown_due=now + timedelta(seconds=rt.settings.worker.lease_s)
        )
    for job in ended:
        log.warning("job %s ended: %s", job.job_id, job.reason)
    for batch_id in sorted({job.batch_id for job in ended}):
        _announce(rt, batch_id)
    with rt.engine.connect() as conn:
        batch_ids = ready.unready(conn)
    settled = [batch_id for batch_id in batch_ids if settle(rt, app, batch_id) is not None]
    return len(ended) + len(settled)


def _announce(rt: FarmRuntime, batch_id: int) -> None:
    try:
        rt.redis.publish(batch_events_channel(batch_id), "finished")
    except Exception:  # long-polls fall back to polling the database
        log.warning("batch %s: cannot publish a finish event", batch_id, exc_info=True)
