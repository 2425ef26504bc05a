"""A trial's life as the API and the workers see it: made with its key, read, ended, listed.

The statements a proxy call runs are in ``farm.trials.statements``; this module works through an
ORM session, as the routes and the stage code hold one.
"""

from __future__ import annotations

import hashlib
import secrets
from typing import Any

from sqlalchemy import select
from sqlalchemy.orm import Session

from farm.db.base import utcnow
from farm.db.models import Job, Trial, TrialCall
from farm.errors import Conflict, NotFound, TrialNotFound
from farm.trials.statements import HISTORY_KEY, fail_call

KEY_PREFIX = "farm-trial-"


def hash_key(key: str) -> str:
    return hashlib.sha256(key.encode()).hexdigest()


def key_matches(key_sha256: str, key: str) -> bool:
    return secrets.compare_digest(key_sha256, hash_key(key))


def new_trial(
    session: Session,
    *,
    trial_id: str | None,
    model: str,
    job_id: int | None = None,
    sampling: dict[str, Any] | None = None,
    meta: dict[str, Any] | None = None,
    history: str | None = None,
) -> tuple[Trial, str]:
    """Add a trial; returns it and its secret key (shown once: only its hash is stored).

    ``history`` (``farm.schemas.trials.TrialHistory``; None: the default) is kept with the sampling
    settings (``statements.split_settings`` reads it back).

    Raises:
        NotFound: there is no job ``job_id``.
        Conflict: a trial with this id exists.
    """
    if job_id is not None and session.get(Job, job_id) is None:
        raise NotFound(f"no job {job_id}", job_id=job_id)
    trial_id = trial_id or f"t-{secrets.token_hex(12)}"
    if session.get(Trial, trial_id) is not None:
        raise Conflict(f"trial {trial_id!r} exists; choose another id or omit it", trial_id=trial_id)
    key = KEY_PREFIX + secrets.token_urlsafe(32)
    trial = Trial(
        id=trial_id,
        key_sha256=hash_key(key),
        job_id=job_id,
        model=model,
        sampling={**(sampling or {}), **({HISTORY_KEY: history} if history is not None else {})},
        meta=meta or {},
        calls=0,
        segments=0,
    )
    session.add(trial)
    session.flush()
    return trial, key


def get(session: Session, trial_id: str) -> Trial:
    """Raises TrialNotFound: no trial has this id."""
    trial = session.get(Trial, trial_id)
    if trial is None:
        raise TrialNotFound(f"no trial {trial_id!r}", trial_id=trial_id)
    return trial


def end(session: Session, trial_id: str) -> Trial:
    """End the trial (idempotent). Calls still generating are marked failed; a streamed one may
    have shown the harness part of an answer the record does not hold, so the record is incomplete.

    Raises:
        TrialNotFound: no trial has this id.
    """
    trial = get(session, trial_id)
    if trial.ended_at is None:
        pending = session.execute(
            select(TrialCall.seq, TrialCall.streamed).where(
                TrialCall.trial_id == trial_id, TrialCall.state == "pending"
            )
        ).all()
        for seq, streamed in pending:
            reason = "the trial ended while this call was generating (or its proxy process died)"
            fail_call(session.connection(), trial_id, seq, reason, seen=streamed)
        trial.ended_at = utcnow()
        session.flush()
        session.refresh(trial)
    return trial


def calls(session: Session, trial_id: str) -> list[TrialCall]:
    return list(session.scalars(select(TrialCall).where(TrialCall.trial_id == trial_id).order_by(TrialCall.seq)))
