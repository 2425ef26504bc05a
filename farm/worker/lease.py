"""Keeping running stages' leases alive, and noticing when a job was cancelled.

One renewer thread per worker process extends every lease it holds with a single UPDATE
every ``lease_s / 3``: with 32 RUN loops in a process that is one statement per beat, not
32 threads and 32 statements. A lease whose row no longer matches (the batch was cancelled,
or another worker took the stage over after this one stalled) is marked lost, and the stage
sees it through ``is_cancelled``.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from datetime import timedelta

import redis
from sqlalchemy import Engine

from farm.config import Settings
from farm.constants import Stage, batch_cancel_key
from farm.db.base import utcnow
from farm.db.jobs.lifecycle import renew_leases

log = logging.getLogger(__name__)

#: how long a cancel-flag lookup is trusted before Redis is asked again.
CANCEL_CACHE_S = 0.25
#: cached flags of batches this process has not asked about for this long are dropped.
CANCEL_CACHE_KEEP_S = 60.0


class Lease:
    """One running stage's hold on its job."""

    def __init__(self, renewer: LeaseRenewer, *, job_id: int, batch_id: int, stage: Stage, deadline: float) -> None:
        self._renewer = renewer
        self.job_id, self.batch_id, self.stage, self.deadline = job_id, batch_id, stage, deadline
        self.lost = False

    def is_cancelled(self) -> bool:
        """True once the batch was cancelled or this worker lost the job: the stage should stop."""
        return self.lost or self._renewer.cancel_flag(self.batch_id)


class LeaseRenewer:
    """Renews the leases of every stage running in this process (see the module docstring)."""

    def __init__(
        self, settings: Settings, *, engine: Callable[[], Engine], redis_client: Callable[[], redis.Redis]
    ) -> None:
        self._lease_s = settings.worker.lease_s
        self._engine = engine
        self._redis = redis_client
        self._leases: dict[int, Lease] = {}
        self._worker_of: dict[int, str] = {}
        # batch id -> (monotonic time of the lookup, cancelled): one Redis read per batch per
        # CANCEL_CACHE_S for the whole process, however many of its stages ask.
        self._cancel_flags: dict[int, tuple[float, bool]] = {}
        self._lock = threading.Lock()
        self._thread: threading.Thread | None = None

    @contextmanager
    def hold(self, *, job_id: int, batch_id: int, stage: Stage, worker: str, deadline: float) -> Iterator[Lease]:
        lease = Lease(self, job_id=job_id, batch_id=batch_id, stage=stage, deadline=deadline)
        with self._lock:
            self._leases[job_id] = lease
            self._worker_of[job_id] = worker
            if self._thread is None:
                self._thread = threading.Thread(target=self._loop, name="farm-lease-renewer", daemon=True)
                self._thread.start()
        try:
            yield lease
        finally:
            with self._lock:
                self._leases.pop(job_id, None)
                self._worker_of.pop(job_id, None)

    def cancel_flag(self, batch_id: int) -> bool:
        """Whether ``batch_id`` was cancelled, as Redis said at most ``CANCEL_CACHE_S`` ago."""
        now = time.monotonic()
        cached = self._cancel_flags.get(batch_id)
        if cached is not None and (cached[1] or now - cached[0] < CANCEL_CACHE_S):
            return cached[1]
        try:
            cancelled = bool(self._redis().exists(batch_cancel_key(batch_id)))
        except Exception:  # Redis away: keep going, the database still decides at completion
            log.warning("cannot read the cancel flag of batch %s", batch_id, exc_info=True)
            return False
        self._cancel_flags[batch_id] = (now, cancelled)
        return cancelled

    def _loop(self) -> None:
        while True:
            time.sleep(self._lease_s / 3)
            try:
                self.renew_once()
            except Exception:  # a database blip must not end renewals; the next beat retries
                log.exception("lease renewal failed")

    def renew_once(self) -> None:
        now = time.monotonic()
        for batch_id, (checked_at, _) in list(self._cancel_flags.items()):
            if now - checked_at > CANCEL_CACHE_KEEP_S:
                self._cancel_flags.pop(batch_id, None)
        by_worker: dict[str, list[int]] = {}
        with self._lock:
            for job_id, lease in self._leases.items():
                # A stage hung past its time limit stops being renewed: the sweeper then gives the
                # job to another worker instead of it being held forever.
                if now > lease.deadline + self._lease_s:
                    continue
                by_worker.setdefault(self._worker_of[job_id], []).append(job_id)
        if not by_worker:
            return
        until = utcnow() + timedelta(seconds=self._lease_s)
        with self._engine().begin() as conn:
            for worker, ids in by_worker.items():
                kept = renew_leases(conn, job_ids=ids, worker=worker, until=until)
                with self._lock:
                    for job_id in ids:
                        if job_id not in kept and job_id in self._leases:
                            self._leases[job_id].lost = True
