"""Re-sends stages whose worker died: the database, not Redis, is the record of what is owed.

Every worker process runs one sweeper thread, and one of them sweeps per interval: the one
that takes the turn key in Redis first (if Redis is away, each sweeps). A stage whose lease
lapsed (its worker was killed, or hung past its deadline) has its lease cleared and its message
sent again to the job's node; the claim on the other side counts the attempt. Two sweepers
never re-send the same stage: the rows are locked with SKIP LOCKED and the lease is cleared in
that transaction.
"""

from __future__ import annotations

import logging
import threading
from datetime import timedelta

from celery import Celery
from redis.exceptions import RedisError

from farm.constants import sweep_turn_key
from farm.db.base import utcnow
from farm.db.lifecycle import expired_leases
from farm.worker.app import FarmRuntime
from farm.worker.enqueue import send_stage

log = logging.getLogger(__name__)


def sweep_once(rt: FarmRuntime, app: Celery) -> int:
    # A lease counts as lost only a whole lease period after it lapsed: a renewer that is merely
    # late (a slow database, a stalled process) must not have its stage run twice at once.
    now, lease = utcnow(), timedelta(seconds=rt.settings.worker.lease_s)
    with rt.engine.begin() as session:
        lapsed = expired_leases(session, now=now - lease, resend_until=now + lease)
    for job_id, stage, node, task_id in lapsed:
        log.warning("job %s: %s lost its worker; sending it again", job_id, stage.value)
        send_stage(app, job_id=job_id, stage=stage, node=node, task_id=task_id)
    return len(lapsed)


def take_turn(rt: FarmRuntime) -> bool:
    """Whether this process sweeps this interval: a farm of many worker processes needs one
    sweep per interval, not one per process."""
    interval_ms = max(1, int(rt.settings.worker.sweep_interval_s * 1000))
    try:
        return bool(rt.redis.set(sweep_turn_key(), rt.settings.worker.node, nx=True, px=interval_ms))
    except RedisError:  # a second sweep is harmless; a missed one delays recovery
        return True


class Sweeper:
    """Runs ``sweep_once`` every ``sweep_interval_s`` on a daemon thread."""

    def __init__(self, rt: FarmRuntime, app: Celery) -> None:
        self._rt, self._app = rt, app
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="farm-sweeper", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=5)

    def _loop(self) -> None:
        while not self._stop.wait(self._rt.settings.worker.sweep_interval_s):
            try:
                if take_turn(self._rt):
                    sweep_once(self._rt, self._app)
            except Exception:  # the database may be briefly away; try again next interval
                log.exception("lease sweep failed")
