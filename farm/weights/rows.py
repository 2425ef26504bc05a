"""Weight updates as rows: the farm's record of what it owes the backends while one is open.

The driver (``farm.weights.coordinator``) writes each phase before it acts on it, so a process that dies
mid-update leaves a row that says what is left to do: another API process (or this one, restarted)
finishes a ``resuming`` or ``rolling_back`` update, and rolls back one the trainer abandoned.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

from sqlalchemy import func, select
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session, selectinload

from farm.db.base import utcnow
from farm.db.models import LLMBackend, WeightUpdate, WeightUpdateBackend
from farm.errors import Conflict, WeightUpdateNotFound

#: phases in which the trainer drives the update (until its deadline).
TRAINER_PHASES = frozenset({"pausing", "paused", "loading", "loaded"})
#: phases in which the farm owes the backends their resume.
OWED_PHASES = frozenset({"resuming", "rolling_back"})


def farm_version(session: Session) -> int:
    """The newest weights any registered backend serves (0 with none)."""
    return int(session.scalar(select(func.max(LLMBackend.weight_version))) or 0)


def begin(
    session: Session,
    *,
    mode: str,
    proxy: str,
    deadline: datetime,
    backends: list[tuple[str, int]],
) -> WeightUpdate:
    """Open an update in phase ``pausing`` over ``backends`` (id, version held).

    Raises:
        Conflict: another update is open (its id and phase in the message).
    """
    open_now = current(session)
    if open_now is not None:
        raise Conflict(
            f"weight update {open_now.id} is still open (phase {open_now.phase}): "
            f"resume or roll it back first (GET /v1/weights shows it)"
        )
    now = utcnow()
    update = WeightUpdate(
        mode=mode,
        phase="pausing",
        is_open=True,
        proxy=proxy,
        from_version=farm_version(session),
        deadline=deadline,
        created_at=now,
        updated_at=now,
    )
    update.backends = [WeightUpdateBackend(backend_id=b, version=v) for b, v in backends]
    session.add(update)
    try:
        session.flush()
    except IntegrityError as exc:  # another process opened one between our check and insert
        raise Conflict("another weight update was opened at the same time") from exc
    return update


def current(session: Session, *, lock: bool = False, skip_locked: bool = False) -> WeightUpdate | None:
    """The open update, if any (locked when asked; ``skip_locked``: None if another holds it)."""
    query = select(WeightUpdate).where(WeightUpdate.is_open.is_(True)).options(selectinload(WeightUpdate.backends))
    if lock:
        query = query.with_for_update(of=WeightUpdate, skip_locked=skip_locked)
    return session.scalars(query).first()


def get(session: Session, update_id: int, *, lock: bool = False) -> WeightUpdate:
    """Raises: WeightUpdateNotFound."""
    query = select(WeightUpdate).where(WeightUpdate.id == update_id).options(selectinload(WeightUpdate.backends))
    if lock:
        query = query.with_for_update(of=WeightUpdate)
    update = session.scalars(query).first()
    if update is None:
        raise WeightUpdateNotFound(f"no weight update with id {update_id}")
    return update


def latest(session: Session) -> WeightUpdate | None:
    return session.scalars(
        select(WeightUpdate).order_by(WeightUpdate.id.desc()).options(selectinload(WeightUpdate.backends)).limit(1)
    ).first()


def set_phase(update: WeightUpdate, phase: str, **values: Any) -> None:
    update.phase = phase
    update.updated_at = utcnow()
    for name, value in values.items():
        setattr(update, name, value)
    if phase in ("done", "rolled_back", "failed"):
        update.is_open = False
        update.finished_at = update.updated_at


def view(update: WeightUpdate) -> dict[str, Any]:
    """The update as ``farm.schemas.WeightUpdateOut`` takes it."""
    return {
        "id": update.id,
        "mode": update.mode,
        "phase": update.phase,
        "open": update.is_open,
        "proxy": update.proxy,
        "from_version": update.from_version,
        "to_version": update.to_version,
        "load_path": update.load_path,
        "deadline": update.deadline,
        "error": update.error,
        "created_at": update.created_at,
        "finished_at": update.finished_at,
        "backends": [
            {
                "id": b.backend_id,
                "version": b.version,
                "paused_at": b.paused_at,
                "loaded_at": b.loaded_at,
                "resumed_at": b.resumed_at,
                "pause_outcome": b.pause_outcome,
                "error": b.error,
            }
            for b in update.backends
        ],
    }
