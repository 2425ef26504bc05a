"""``GET /v1/overview``: the farm at a glance, for ``farm status``'s live view."""

from __future__ import annotations

from fastapi import APIRouter
from sqlalchemy import select, text
from sqlalchemy.orm import Session

from farm import metrics, signals
from farm.api.deps import DB, AppState, State
from farm.api.metrics import queue_lengths, with_tokens
from farm.api.routes.backends import backend_out
from farm.constants import BatchState, Stage
from farm.db import reads
from farm.db.budget import api_pools
from farm.db.models import Batch
from farm.schemas import BackendOut, DatabaseOut, Overview, WorkerOut

router = APIRouter(prefix="/v1", tags=["health"])

#: running batches shown, newest first.
MAX_BATCHES = 20


@router.get("/overview", operation_id="get_overview", response_model=Overview, summary="The farm at a glance")
def overview(state: State, db: DB) -> Overview:
    running = db.scalars(
        select(Batch.id).where(Batch.state == BatchState.RUNNING).order_by(Batch.id.desc()).limit(MAX_BATCHES)
    ).all()
    workers = [
        WorkerOut(
            name=w.name,
            node=w.node,
            stages=[Stage(s) for s in w.stages],
            slots=w.slots,
            pid=w.pid,
            db_connections=w.db_connections,
        )
        for w in metrics.read_workers(state.redis)
    ]
    return Overview(
        workers=workers,
        queues=queue_lengths(state, db),
        backends=_backends(state),
        sandboxes=metrics.read_sandboxes(state.redis),
        batches=[with_tokens(state, reads.batch_status(db, batch_id)) for batch_id in running],
        database=_database(state, db, workers),
    )


def _backends(state: AppState) -> list[BackendOut]:
    backends = [backend_out(b) for b in state.balancer.backends()]
    rates = signals.recent_tokens_per_s(state.redis, [b.id for b in backends])
    return [b.model_copy(update={"tokens_per_s": rates.get(b.id)}) for b in backends]


def _database(state: AppState, db: Session, workers: list[WorkerOut]) -> DatabaseOut | None:
    """The connection budget (``farm.db.budget``) of the processes heard from, next to what PostgreSQL holds."""
    if db.get_bind().dialect.name != "postgresql":
        return None
    in_use = db.execute(
        text("SELECT count(*) FROM pg_stat_activity WHERE backend_type = 'client backend'")
    ).scalar_one()
    max_connections = db.execute(text("SHOW max_connections")).scalar_one()
    budget = api_pools(state.settings).total + sum(w.db_connections for w in workers)
    return DatabaseOut(budget=budget, in_use=int(in_use), max_connections=int(max_connections))
