"""Keeps the farm's promises after a crash: every owed stage is sent again in bounded time,
a Redis that came back empty is noticed, and a lost node's jobs are handed on.

PostgreSQL records every stage message the farm owes (``farm.db.owed``) with the time it is
sent again if nobody claims it. The reconciler of the process whose turn it is (see
``farm.worker.sweeper``) sends again those past that time, skipping any whose message still
waits in its queue. Every process also checks the epoch key each interval: when Redis lost it,
it lost every queued message too, and the process that sets a new one re-sends all that is owed
at once. Claims make every duplicate harmless.
"""

from __future__ import annotations

import logging
import uuid
from collections import defaultdict
from datetime import datetime, timedelta

from celery import Celery

from farm.constants import Stage, batch_events_channel, epoch_key, queue_name
from farm.db import nodes, owed, teardowns
from farm.db.base import utcnow
from farm.worker.app import FarmRuntime
from farm.worker.enqueue import send_many
from farm.worker.queues import waiting_jobs

log = logging.getLogger(__name__)

#: owed jobs taken per transaction.
RESEND_CHUNK = 500
#: missed reports (in sweep intervals) after which a node's run of reports starts over.
HEARTBEAT_GAP_INTERVALS = 3


class Reconciler:
    """One per worker process, driven by its sweeper thread (see the module docstring)."""

    def __init__(self, rt: FarmRuntime, app: Celery) -> None:
        self._rt, self._app = rt, app
        #: since when this process's node has reported without a gap (None: not yet, or a gap).
        self._node_beating_since: datetime | None = None

    def heartbeat(self) -> None:
        """Report this node alive."""
        w = self._rt.settings.worker
        now = utcnow()
        gap = timedelta(seconds=HEARTBEAT_GAP_INTERVALS * w.sweep_interval_s)
        try:
            with self._rt.engine.begin() as conn:
                self._node_beating_since = nodes.heartbeat(conn, w.node, now=now, gap_since=now - gap)
        except Exception:
            self._node_beating_since = None
            raise

    def redis_was_emptied(self) -> bool:
        """Whether Redis lost the epoch key (and so every queued message) and this process is the
        one that set a new one, and so must re-send everything owed."""
        client = self._rt.redis
        if client.exists(epoch_key()):
            return False
        return bool(client.set(epoch_key(), uuid.uuid4().hex, nx=True))

    def resend(self, *, everything: bool = False) -> int:
        """Send again what is owed and overdue (``everything``: all that is owed, now, without
        looking in the queues: Redis lost them). Returns how many messages were sent."""
        lease = timedelta(seconds=self._rt.settings.worker.lease_s)
        start = utcnow()
        # An owed job's resend time is at most a lease after it became owed: everything owed
        # before now is due before now + lease. What this pass postpones lands past that.
        before = start + lease if everything else start
        sent = 0
        while True:
            chunk, messages = self._resend_chunk(before=before, postpone_to=utcnow() + lease, look=not everything)
            if messages:
                sent += send_many(self._app, messages)
            if chunk < RESEND_CHUNK:
                break
        return sent + self._resend_teardowns(before=before, postpone_to=utcnow() + lease, look=not everything)

    def _resend_teardowns(self, *, before: datetime, postpone_to: datetime, look: bool) -> int:
        """Teardowns still owed past their time: the stage message goes to the node again (its
        claim finds the job ended and tears the sandbox down), unless one already waits there."""
        with self._rt.engine.begin() as conn:
            due = teardowns.due(conn, before=before, limit=RESEND_CHUNK)
            waiting: dict[str, set[int]] = {}
            messages: list[tuple[int, Stage, str | None, str | None]] = []
            for item in due:
                queue = queue_name(item.stage, item.node)
                if look and queue not in waiting:
                    waiting[queue] = waiting_jobs(self._rt.redis, queue)
                if item.job_id not in waiting.get(queue, set()):
                    messages.append((item.job_id, item.stage, item.node, None))
            teardowns.postpone(conn, [item.job_id for item in due], until=postpone_to)
        if messages:
            log.warning("%d teardown(s) of cancelled jobs still owed: sending again", len(messages))
            send_many(self._app, messages)
        return len(messages)

    def _resend_chunk(
        self, *, before: datetime, postpone_to: datetime, look: bool
    ) -> tuple[int, list[tuple[int, Stage, str | None, str | None]]]:
        messages = []
        with self._rt.engine.begin() as conn:
            due = owed.due(conn, before=before, limit=RESEND_CHUNK)
            by_queue: dict[str, list[owed.Owed]] = defaultdict(list)
            for item in due:
                if item.stage is not Stage.INIT and not item.node:
                    log.error("job %s is owed %s but has no node; left for node loss", item.job_id, item.stage)
                    continue
                by_queue[queue_name(item.stage, item.node)].append(item)
            for queue, items in by_queue.items():
                waiting = waiting_jobs(self._rt.redis, queue) if look else set()
                lost = [item for item in items if item.job_id not in waiting]
                if lost:
                    log.warning(
                        "%d owed %s message(s) not claimed in time and not in the queue: sending again (jobs %s)",
                        len(lost),
                        queue,
                        ", ".join(str(item.job_id) for item in lost[:10]) + (" ..." if len(lost) > 10 else ""),
                    )
                messages += [(item.job_id, item.stage, item.node, item.task_id) for item in lost]
            owed.postpone(conn, [item.job_id for item in due], until=postpone_to)
        return len(due), messages

    def hand_on_lost_nodes(self) -> int:
        """Restart or fail the jobs of nodes silent for ``node_lost_s``; returns the jobs handed on.
        Only a process whose own node has reported throughout that time judges: after a database
        outage every node was silent, and none is lost."""
        w = self._rt.settings.worker
        now = utcnow()
        bound = timedelta(seconds=w.node_lost_s)
        if self._node_beating_since is None or self._node_beating_since > now - bound:
            return 0
        with self._rt.engine.begin() as conn:
            silent = nodes.lost(conn, now=now, silent_since=now - bound)
        handed = 0
        for name, seen_at in silent:
            if name == w.node:
                continue
            with self._rt.engine.begin() as conn:
                out = nodes.hand_on(
                    conn,
                    name,
                    now=utcnow(),
                    seen_at=seen_at,
                    restart=w.on_node_lost == "restart",
                    max_restarts=w.max_attempts,
                    owed_until=utcnow() + timedelta(seconds=w.lease_s),
                )
            log.error(
                "node %s lost (no worker seen since %s): %d job(s) start over from INIT, %d failed",
                name,
                seen_at.isoformat(timespec="seconds"),
                len(out.restarted),
                out.failed,
            )
            send_many(self._app, ((job_id, Stage.INIT, None, task_id) for job_id, task_id in out.restarted))
            if out.failed:
                for batch_id in out.batches:
                    self._rt.redis.publish(batch_events_channel(batch_id), "finished")
            handed += len(out.restarted) + out.failed
        return handed
