"""``GET /v1/overview``: the farm at a glance, for ``farm status``'s live view."""

from __future__ import annotations

from fastapi import APIRouter
from sqlalchemy import select

from farm import metrics
from farm.api.deps import DB, State
from farm.api.metrics import queue_lengths
from farm.api.routes.backends import backend_out
from farm.constants import BatchState, Stage
from farm.db import reads
from farm.db.models import Batch
from farm.schemas import Overview, WorkerOut

router = APIRouter(prefix="/v1", tags=["health"])

#: running batches shown, newest first.
MAX_BATCHES = 20


@router.get("/overview", operation_id="get_overview", response_model=Overview, summary="The farm at a glance")
def overview(state: State, db: DB) -> Overview:
    running = db.scalars(
        select(Batch.id).where(Batch.state == BatchState.RUNNING).order_by(Batch.id.desc()).limit(MAX_BATCHES)
    ).all()
    workers = [
        WorkerOut(name=w.name, node=w.node, stages=[Stage(s) for s in w.stages], slots=w.slots, pid=w.pid)
        for w in metrics.read_workers(state.redis)
    ]
    return Overview(
        workers=workers,
        queues=queue_lengths(state, db),
        backends=[backend_out(b) for b in state.balancer.backends()],
        sandboxes=metrics.read_sandboxes(state.redis),
        batches=[reads.batch_status(db, batch_id) for batch_id in running],
    )
