"""Re-sends stages whose worker died: the database, not Redis, is the record of what is owed.

Every worker process runs one sweeper thread. Each interval every process reports its node
alive and checks that Redis still holds the farm's epoch (``farm.worker.reconciler``), and one
process sweeps: the one that takes the turn key in Redis first (if Redis is away, each sweeps).
A sweep re-sends stages whose lease lapsed (its worker was killed, or hung past its deadline),
after clearing the lease, to the job's node (the claim on the other side counts the attempt);
then owed stages nobody claimed in time; then it hands on the jobs of lost nodes. Two sweepers
never re-send the same stage: the rows are locked with SKIP LOCKED and the lease is cleared or
postponed in that transaction.
"""

from __future__ import annotations

import logging
import threading
from datetime import timedelta

from celery import Celery
from redis.exceptions import RedisError

from farm import metrics
from farm.constants import sweep_turn_key
from farm.db.base import utcnow
from farm.db.jobs.lifecycle import expired_leases
from farm.sandbox import sandbox_root
from farm.sandbox.registry import Registry
from farm.worker import deadlines, dynamic
from farm.worker.app import FarmRuntime
from farm.worker.enqueue import send_stage
from farm.worker.reconciler import Reconciler

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
    """Runs ``tick`` every ``sweep_interval_s`` on a daemon thread."""

    def __init__(self, rt: FarmRuntime, app: Celery, identity: metrics.WorkerProcess | None = None) -> None:
        self._rt, self._app = rt, app
        #: what this process says of itself each interval (for ``farm status`` and /metrics).
        self._identity = identity
        self.reconciler = Reconciler(rt, app)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="farm-sweeper", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=5)

    def _loop(self) -> None:
        while not self._stop.wait(self._rt.settings.worker.sweep_interval_s):
            self.tick()

    def _say_alive(self) -> None:
        """For /metrics and ``farm status``: this process, and the node's live sandboxes from its
        registry (any worker of the node may say it). Both lapse three intervals after the last word."""
        settings = self._rt.settings
        ttl_s = 3 * settings.worker.sweep_interval_s
        if self._identity is not None:
            metrics.record_worker(self._rt.redis, self._identity, ttl_s=ttl_s)
        count = len(Registry(root=sandbox_root(settings)).records())
        metrics.record_sandboxes(self._rt.redis, settings.worker.node, count, ttl_s=ttl_s)

    def tick(self) -> None:
        """One interval's work; each part fails alone (the database or Redis may be briefly
        away) and is tried again next interval."""
        try:
            self.reconciler.heartbeat()
        except Exception:
            log.exception("cannot report this node alive")
        try:
            self._say_alive()
        except Exception:
            log.exception("cannot count this node's sandboxes")
        try:
            if self.reconciler.redis_was_emptied():
                # A new Redis has no epoch either (every embedded start): that is news only when
                # something owed had to be sent again.
                if sent := self.reconciler.resend(everything=True):
                    log.warning(
                        "Redis lost the farm's epoch (restarted empty?): sent %d owed stage message(s) again", sent
                    )
                else:
                    log.info("Redis had no epoch (new, or restarted empty): set one; nothing owed was lost")
        except Exception:
            log.exception("epoch check failed")
        turn = False
        try:
            turn = take_turn(self._rt)
            if turn:
                sweep_once(self._rt, self._app)
                self.reconciler.resend()
                self.reconciler.hand_on_lost_nodes()
                dynamic.redrive(self._rt, self._app)
        except Exception:
            log.exception("lease sweep failed")
        try:
            # One process per interval, as the lease sweep: the farm's turn comes round every interval,
            # so a limit or a deadline is acted on within one (row locks keep two sweepers from acting
            # twice). Every process every tick cost each process's small pool statements just as a
            # database that was full came back, and a lease went unrenewed (the crash suite's
            # test_a_full_database_costs_time_not_attempts: init:lost).
            if turn:
                deadlines.redrive(self._rt, self._app)
        except Exception:
            log.exception("deadline sweep failed")
