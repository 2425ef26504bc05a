"""The statements of a proxy call, and the reads behind them: one trial's calls in SQL.

A call's tokens are stored once: ``delta_ids`` holds only the prompt tokens beyond its parent's
end, so a call's full ids are rebuilt by walking its ancestors (``end_ids``). The proxy keeps the
ids of recent calls in memory, so the walk happens only in a process that has not seen the trial.

The statements a proxy call runs (``find_parent``, ``add_call``, ``finish_call``) are SQLAlchemy
Core, built once: building an expression and loading ORM objects cost more Python than the
round trips themselves. On PostgreSQL a call's start is one statement and its finish one
statement under the trial's lock; SQLite (no writes in WITH) takes one statement per table.
``farm.trials.async_statements`` runs the same statements from the proxy's event loop.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, NoReturn, cast

import numpy as np
from sqlalchemy import ARRAY, Connection, LargeBinary, Table, and_, any_, bindparam, case, func, insert, select, update
from sqlalchemy.exc import IntegrityError

from farm.db.arrays import FLOAT32, INT32
from farm.db.base import utcnow
from farm.db.models import DONE_CHILD_INDEX, Trial, TrialCall
from farm.errors import TrialEnded, TrialNotFound
from farm.schemas.trials import DEFAULT_HISTORY
from farm.trials.values import CallFinish, CallStart, CompletionEnd, Credentials, LatestCall, Parent

#: the key of a trial's history policy in its stored settings (``split_settings``).
HISTORY_KEY = "history"

TRIALS, CALLS = cast(Table, Trial.__table__), cast(Table, TrialCall.__table__)


CREDENTIALS = select(TRIALS.c.key_sha256, TRIALS.c.model, TRIALS.c.sampling, TRIALS.c.ended_at).where(
    TRIALS.c.id == bindparam("trial_id")
)


def credentials(conn: Connection, trial_id: str) -> Credentials | None:
    row = conn.execute(CREDENTIALS, {"trial_id": trial_id}).one_or_none()
    if row is None:
        return None
    sampling, history = split_settings(row.sampling)
    return Credentials(
        key_sha256=row.key_sha256,
        model=row.model,
        sampling=sampling,
        ended=row.ended_at is not None,
        history=history,
    )


def split_settings(stored: dict[str, Any] | None) -> tuple[dict[str, Any], str]:
    """A trial's stored settings (the ``sampling`` column) as its sampling and its history policy.

    The policy rides in that JSON under ``HISTORY_KEY`` (no column of its own); a trial made before
    it existed has none and gets the default.
    """
    sampling = dict(stored or {})
    return sampling, str(sampling.pop(HISTORY_KEY, DEFAULT_HISTORY))


# A call's end_hash is the chained hash of its request's messages plus its reply, so a call whose
# end_hash is among a request's hashes covers its request's messages + 1 of them: the longest
# covered prefix is the candidate with the most request hashes (16 bytes each).
def _parent_query(among_hashes: Any) -> Any:
    return (
        select(
            CALLS.c.seq,
            CALLS.c.segment,
            func.length(CALLS.c.message_hashes).label("hash_bytes"),
            # Only the last sampled id (an answer may be thousands of ids).
            func.substr(
                CALLS.c.sampled_ids, func.length(CALLS.c.sampled_ids) - (INT32.itemsize - 1), INT32.itemsize
            ).label("last_sampled"),
            func.length(CALLS.c.sampled_ids).label("sampled_bytes"),
            CALLS.c.started_at,
        )
        .where(CALLS.c.trial_id == bindparam("trial_id"), CALLS.c.state == "done", among_hashes)
        .order_by(func.length(CALLS.c.message_hashes).desc(), CALLS.c.seq.desc())
        .limit(1)
    )


_PARENT = _parent_query(CALLS.c.end_hash.in_(bindparam("hashes", expanding=True)))
#: the same, with the hashes as one array parameter (PostgreSQL: one statement text for any number
#: of hashes, which a server-side prepared statement needs).
PARENT_ANY = _parent_query(CALLS.c.end_hash == any_(bindparam("hashes", type_=ARRAY(LargeBinary))))


def find_parent(conn: Connection, trial_id: str, message_hashes: Sequence[bytes]) -> Parent | None:
    """The finished call whose request + reply is the longest prefix of these messages (not all of
    them); among equal ones (the same reply given twice), the latest call."""
    if len(message_hashes) < 2:
        return None
    row = conn.execute(_PARENT, {"trial_id": trial_id, "hashes": list(message_hashes[:-1])}).one_or_none()
    return parent_of(row, len(message_hashes[0])) if row is not None else None


def parent_of(row: Any, hash_size: int) -> Parent:
    """A ``_PARENT`` row as a Parent."""
    last = bytes(row.last_sampled or b"")
    return Parent(
        seq=row.seq,
        segment=row.segment,
        covered=row.hash_bytes // hash_size + 1,
        last_sampled_id=int(np.frombuffer(last, dtype=INT32)[0]) if len(last) == INT32.itemsize else None,
        sampled_tokens=(row.sampled_bytes or 0) // INT32.itemsize,
        started_at=row.started_at,
    )


_LATEST = (
    select(CALLS.c.seq, CALLS.c.message_hashes, CALLS.c.end_hash)
    .where(CALLS.c.trial_id == bindparam("trial_id"), CALLS.c.state == "done")
    .order_by(CALLS.c.seq.desc())
    .limit(1)
)


def latest_call(conn: Connection, trial_id: str) -> LatestCall | None:
    """The most recent finished call."""
    row = conn.execute(_LATEST, {"trial_id": trial_id}).one_or_none()
    if row is None:
        return None
    raw = bytes(row.message_hashes)
    hashes = [raw[i : i + 16] for i in range(0, len(raw), 16)]
    return LatestCall(row.seq, [*hashes, bytes(row.end_hash)] if row.end_hash is not None else hashes)


_COMPLETION_ENDS = (
    select(
        CALLS.c.seq,
        CALLS.c.segment,
        CALLS.c.finish_reason,
        CALLS.c.prompt_tokens,
        func.length(CALLS.c.sampled_ids).label("sampled_bytes"),
        CALLS.c.message_hashes,
        CALLS.c.end_hash,
        CALLS.c.started_at,
        # The whole reply, not ``reply -> 'text_keys'``: PostgreSQL's json operators refuse a
        # reply whose text holds a NUL (\u0000), which a model may sample.
        CALLS.c.reply,
    )
    .where(CALLS.c.trial_id == bindparam("trial_id"), CALLS.c.state == "done", CALLS.c.wire == bindparam("wire"))
    .order_by(CALLS.c.seq)
)


def completion_ends(conn: Connection, trial_id: str, wire: str) -> list[CompletionEnd]:
    """The trial's finished calls of the legacy completion format ``wire``, in seq order."""
    return [
        CompletionEnd(
            seq=row.seq,
            segment=row.segment,
            finish_reason=row.finish_reason,
            stop_string=(row.reply or {}).get("stop_string"),
            end_tokens=row.prompt_tokens + row.sampled_bytes // INT32.itemsize,
            end_hash=bytes(row.end_hash),
            prompt_hash=bytes(row.message_hashes),
            text_keys=(row.reply or {}).get("text_keys"),
            started_at=row.started_at,
        )
        for row in conn.execute(_COMPLETION_ENDS, {"trial_id": trial_id, "wire": wire})
    ]


_ANCESTRY = select(CALLS.c.seq, CALLS.c.parent_seq, CALLS.c.delta_ids, CALLS.c.sampled_ids).where(
    CALLS.c.trial_id == bindparam("trial_id"), CALLS.c.seq <= bindparam("seq")
)


def end_ids(conn: Connection, trial_id: str, seq: int) -> np.ndarray:
    """A finished call's full ids: its prompt and the ids it sampled, rebuilt from its ancestors."""
    rows = {r.seq: r for r in conn.execute(_ANCESTRY, {"trial_id": trial_id, "seq": seq})}
    parts: list[bytes] = []
    at: int | None = seq
    while at is not None:
        row = rows[at]
        parts += [bytes(row.sampled_ids), bytes(row.delta_ids)]
        at = row.parent_seq
    return np.frombuffer(b"".join(reversed(parts)), dtype=INT32)


#: takes the next seq (and, with ``_new_segment`` = 1, the next segment) of an open trial; the
#: row lock it takes orders the calls of one trial.
_TAKE_SEQ = (
    update(TRIALS)
    .where(TRIALS.c.id == bindparam("_trial_id"), TRIALS.c.ended_at.is_(None))
    .values(calls=TRIALS.c.calls + 1, segments=TRIALS.c.segments + bindparam("_new_segment"))
    .returning((TRIALS.c.calls - 1).label("seq"), (TRIALS.c.segments - 1).label("last_segment"))
)
#: the columns of a call's pending row that its start sets (the rest keep their defaults).
_PENDING_COLUMNS = (
    "trial_id",
    "parent_seq",
    "state",
    "wire",
    "streamed",
    "message_hashes",
    "delta_ids",
    "messages",
    "prompt_tokens",
    "sampled_ids",
    "logprobs",
    "continuity",
    "started_at",
)
_INSERT_PENDING = insert(CALLS)


def _add_call_statement() -> Any:
    """PostgreSQL: take the seq and insert the pending row in one statement."""
    taken = _TAKE_SEQ.cte("taken")
    segment = case((bindparam("_new_segment") == 1, taken.c.last_segment), else_=bindparam("_parent_segment"))
    values = [bindparam(name, type_=CALLS.c[name].type) for name in _PENDING_COLUMNS]
    return (
        insert(CALLS)
        .from_select([*_PENDING_COLUMNS, "seq", "segment"], select(*values, taken.c.seq, segment))
        .add_cte(taken)
        .returning(CALLS.c.seq)
    )


ADD_CALL = _add_call_statement()


def add_call(conn: Connection, trial_id: str, start: CallStart) -> int:
    """Record a call as started (state ``pending``), taking its seq and, without a parent, a new
    segment; returns the seq. The caller commits (on SQLite: the two statements are one transaction).

    Raises:
        TrialNotFound, TrialEnded: the trial is not open.
    """
    pending = pending_params(trial_id, start)
    if conn.dialect.name == "postgresql":
        seq = conn.execute(ADD_CALL, pending).scalar_one_or_none()
        if seq is None:
            raise_closed(conn, trial_id)
        return int(seq)
    taken = conn.execute(_TAKE_SEQ, {k: pending[k] for k in ("_trial_id", "_new_segment")}).one_or_none()
    if taken is None:
        raise_closed(conn, trial_id)
    parent = start.parent
    segment = taken.last_segment if parent is None else parent.segment
    row = {name: pending[name] for name in _PENDING_COLUMNS}
    conn.execute(_INSERT_PENDING, {**row, "seq": taken.seq, "segment": segment})
    return int(taken.seq)


def pending_params(trial_id: str, start: CallStart) -> dict[str, Any]:
    """``ADD_CALL``'s parameters (``add_call``)."""
    parent = start.parent
    pending = {
        "trial_id": trial_id,
        "parent_seq": parent.seq if parent is not None else None,
        "state": "pending",
        "wire": start.wire,
        "streamed": start.streamed,
        "message_hashes": b"".join(start.message_hashes),
        "delta_ids": np.asarray(start.delta_ids, dtype=INT32).tobytes(),
        "messages": start.messages,
        "prompt_tokens": start.prompt_tokens,
        "sampled_ids": b"",
        "logprobs": b"",
        "continuity": start.continuity,
        "started_at": start.started_at,
    }
    return {
        **pending,
        "_trial_id": trial_id,
        "_new_segment": 1 if parent is None else 0,
        "_parent_segment": parent.segment if parent is not None else None,
    }


def raise_closed(conn: Connection, trial_id: str) -> NoReturn:
    """Why a call could not start.

    Raises:
        TrialNotFound: no trial has this id.
        TrialEnded: the trial has ended.
    """
    if conn.execute(CREDENTIALS, {"trial_id": trial_id}).one_or_none() is None:
        raise TrialNotFound(f"no trial {trial_id!r}", trial_id=trial_id)
    raise TrialEnded(f"trial {trial_id!r} has ended", trial_id=trial_id)


LOCK_TRIAL = select(TRIALS.c.id).where(TRIALS.c.id == bindparam("_trial_id")).with_for_update()
_SIBLING = CALLS.alias("sibling")
#: a finished call of the same parent in the same segment: the call finishing now is a branch.
_DONE_SIBLING = (
    select(_SIBLING.c.seq)
    .where(
        _SIBLING.c.trial_id == CALLS.c.trial_id,
        _SIBLING.c.parent_seq == CALLS.c.parent_seq,
        _SIBLING.c.segment == CALLS.c.segment,
        _SIBLING.c.state == "done",
    )
    .limit(1)
)
FINISHED_COLUMNS = (
    "sampled_ids",
    "logprobs",
    "finish_reason",
    "reply",
    "end_hash",
    "backend_id",
    "first_token_s",
    "latency_s",
    "weight_versions",
    "finished_at",
)
_PENDING_CALL = and_(
    CALLS.c.trial_id == bindparam("_trial_id"), CALLS.c.seq == bindparam("_seq"), CALLS.c.state == "pending"
)
#: the usual finish: the call is still pending and no sibling finished before it.
FINISH = update(CALLS).where(_PENDING_CALL, ~_DONE_SIBLING.exists()).values(state="done").returning(CALLS.c.seq)
_BRANCH_OF = select(CALLS.c.continuity, _DONE_SIBLING.scalar_subquery().label("sibling")).where(_PENDING_CALL)
_NEW_SEGMENT = (
    update(TRIALS)
    .where(TRIALS.c.id == bindparam("_trial_id"))
    .values(segments=TRIALS.c.segments + 1)
    .returning((TRIALS.c.segments - 1).label("segment"))
)
_FINISH_BRANCH = update(CALLS).where(_PENDING_CALL).values(state="done")


def finish_call(conn: Connection, trial_id: str, seq: int, finish: CallFinish, *, parent_seq: int | None) -> bool:
    """Record what the call sampled and answered. False when the call was not pending any more.
    The caller commits, durably: the harness gets the answer only after that.

    A call whose parent already has a finished child in the parent's segment (a retry, or a second
    continuation of the same history) is a branch: it moves to a segment of its own. This is decided
    here, under the trial's lock, rather than at the start: a sibling that failed or is still
    running (perhaps on a proxy process that died) does not make a retry a branch. The lock comes
    first, in a statement of its own, so the check (the next statement) sees every sibling that
    finished before it under the lock; ``DONE_CHILD_INDEX`` catches one that finished without it.
    """
    if parent_seq is not None:
        conn.execute(LOCK_TRIAL, {"_trial_id": trial_id})
    finished = finished_params(finish)
    call = {"_trial_id": trial_id, "_seq": seq}
    if _finished(conn, {**call, **finished}):
        return True
    if parent_seq is None:
        return False
    branch = conn.execute(_BRANCH_OF, call).one_or_none()
    if branch is None or branch.sibling is None:
        return False  # no longer pending
    segment = conn.execute(_NEW_SEGMENT, {"_trial_id": trial_id}).scalar_one()
    entry = {
        **(finish.continuity or branch.continuity),
        "branch": True,
        "sibling": branch.sibling,
        "reason": f"call {branch.sibling} already continued call {parent_seq}'s history in its segment "
        "(a retry, or another sample of the same request): this call branches off",
    }
    conn.execute(_FINISH_BRANCH, {**call, **finished, "segment": segment, "continuity": entry})
    return True


def _finished(conn: Connection, params: dict[str, Any]) -> bool:
    """``FINISH``: False when the call is not pending, or a sibling finished first. A finish on a
    proxy's event loop takes no lock (``farm.trials.async_statements``): a sibling may commit there between
    this statement's check and its update, and ``uq_trial_calls_done_child`` then refuses the
    update; on PostgreSQL it runs in a savepoint, so the transaction goes on to branch the call."""
    if conn.dialect.name != "postgresql":
        return conn.execute(FINISH, params).first() is not None
    try:
        with conn.begin_nested():
            return conn.execute(FINISH, params).first() is not None
    except IntegrityError as exc:
        if DONE_CHILD_INDEX not in str(exc.orig):
            raise
        return False


def finished_params(finish: CallFinish) -> dict[str, Any]:
    """``FINISH``'s values (``finish_call``): ``FINISHED_COLUMNS``, and ``continuity`` when given."""
    finished = {
        "sampled_ids": np.asarray(finish.sampled_ids, dtype=INT32).tobytes(),
        "logprobs": np.asarray(finish.logprobs, dtype=FLOAT32).tobytes(),
        "finish_reason": finish.finish_reason,
        "reply": finish.reply,
        "end_hash": finish.end_hash,
        "backend_id": finish.backend_id,
        "first_token_s": finish.first_token_s,
        "latency_s": finish.latency_s,
        "weight_versions": [list(span) for span in finish.weight_versions],
        "finished_at": utcnow(),
    }
    if finish.continuity is not None:
        finished["continuity"] = finish.continuity
    return finished


def fail_call(conn: Connection, trial_id: str, seq: int, error: str, *, seen: bool = False) -> None:
    """The call gave no complete answer. ``seen``: part of its answer already reached the harness,
    and what it saw cannot be recorded: the trial's record is incomplete."""
    conn.execute(
        update(CALLS)
        .where(CALLS.c.trial_id == trial_id, CALLS.c.seq == seq, CALLS.c.state == "pending")
        .values(state="failed", error=error[:2000], finished_at=utcnow())
    )
    if seen:
        conn.execute(
            update(TRIALS)
            .where(TRIALS.c.id == trial_id, TRIALS.c.incomplete.is_(None))
            .values(incomplete=f"call {seq} streamed part of an answer and then failed: {error[:500]}")
        )
