"""verl-recipe's proxy session calls, served from trials: an existing ``RemoteAgentLoop`` setup
points at the farm instead of its own ``LLMProxyServer``.

verl's loop (verl-project/verl-recipe ``agentic/agent_loop/remote_agent_loop.py``, and the
``remote_agent`` recipe derived from it) talks to its proxy with five bodiless calls, and hands its
harness the base URL ``http://{host}:{port of the proxy URL}/{trial_id}/v1``:

========================================  ==========================================
``POST   /sessions/{trial_id}``           register: create the trial (409 if it exists)
``GET    /sessions/{trial_id}``           read: the record as verl's ``SessionRecord``
``POST   /sessions/{trial_id}/complete``  end the trial (its backend is released)
``POST   /sessions/{trial_id}/reset``     forget the calls so far (before a retry)
``DELETE /sessions/{trial_id}``           delete the trial and its record
========================================  ==========================================

The record keeps verl's shape: ``turns``, one per answered call in order, each with the
``request_messages`` (the whole request, or with ``?messages=delta`` only the messages added since
the previous turn, as the ``remote_agent`` recipe stores them), ``completion_text``,
``completion_token_ids`` and ``completion_logprobs`` (exactly what the backend sampled),
``finish_reason`` and ``tool_calls``. verl re-renders the messages to rebuild prompt and tool
tokens; the farm's token-exact record (prompt, tool and model tokens, loss mask, certificate)
comes along under ``farm``, which verl's model ignores and a trainer may read instead.

These routes take the farm's token, as a bearer token or as the password of HTTP Basic auth (a
proxy URL ``http://verl:TOKEN@farm:8700`` makes aiohttp send that). The harness's calls take the
trial's key (``proxy.verl_harness_key``, as verl configures one key for all its harnesses).
"""

from __future__ import annotations

import base64
import binascii
import json
import secrets
from typing import Annotated, Any, Literal

import numpy as np
from fastapi import APIRouter, Depends, HTTPException, Path, Query, Request
from fastapi.security import HTTPAuthorizationCredentials
from sqlalchemy import delete as delete_rows
from sqlalchemy.orm import Session

from farm.api.deps import DB, State, bearer_scheme
from farm.api.errors import error_responses
from farm.constants import trial_balancer_key
from farm.db.arrays import FLOAT32, INT32, encode_ids, encode_logprobs, encode_mask
from farm.db.models import Trial, TrialCall
from farm.db.session import transaction
from farm.errors import Conflict, TrialEnded
from farm.schemas import TRIAL_ID_PATTERN
from farm.trials import record, store

#: where a trial a verl session made says so (``metadata``).
VERL_SESSION = "verl_session"

SessionId = Annotated[str, Path(pattern=TRIAL_ID_PATTERN, description="verl's trial id (1-64 of A-Z a-z 0-9 . _ -)")]


async def require_token_or_basic(
    state: State, request: Request, bearer: Annotated[HTTPAuthorizationCredentials | None, Depends(bearer_scheme)]
) -> None:
    """The farm's token as ``Bearer TOKEN`` or as the password of ``Basic`` auth.

    Raises:
        HTTPException: 401 when it is missing or wrong.
    """
    token = state.settings.api.token
    assert token is not None  # create_app refuses to start without one
    scheme, _, value = request.headers.get("authorization", "").partition(" ")
    given: str | None = None
    if bearer is not None:
        given = bearer.credentials
    elif scheme.lower() == "basic":
        try:
            given = base64.b64decode(value.strip(), validate=True).decode().partition(":")[2]
        except (binascii.Error, UnicodeDecodeError):
            raise HTTPException(401, "malformed Basic credentials: base64 of 'user:TOKEN' expected") from None
    if not given:
        raise HTTPException(
            401,
            "missing credentials: give the proxy URL as http://verl:<FARM_API__TOKEN>@host:port "
            "(Basic auth) or send 'Authorization: Bearer <FARM_API__TOKEN>'",
        )
    if not secrets.compare_digest(given.encode(), token.get_secret_value().encode()):
        raise HTTPException(401, "invalid token")


router = APIRouter(prefix="/sessions", tags=["verl sessions"], dependencies=[Depends(require_token_or_basic)])


def _get(session: Session, trial_id: str) -> Trial:
    trial = store.get(session, trial_id)
    if not trial.meta.get(VERL_SESSION):
        # A trial of the farm's own API is not verl's to reset or delete through this door.
        raise Conflict(f"trial {trial_id!r} was not registered as a verl session; use /v1/trials", trial_id=trial_id)
    return trial


def _new(session: Session, trial_id: str, state: State) -> str:
    """Create the trial; returns its key."""
    configured = state.settings.proxy.verl_harness_key
    trial, key = store.new_trial(
        session, trial_id=trial_id, model=state.settings.llm.builtin_model_name, meta={VERL_SESSION: True}
    )
    if configured is not None:
        key = configured.get_secret_value()
        trial.key_sha256 = store.hash_key(key)
    return key


@router.post(
    "/{session_id}",
    operation_id="verl_register_session",
    responses=error_responses(401, 409, 422),
    summary="verl: register a session (creates the trial)",
)
def register(session_id: SessionId, state: State, request: Request) -> dict[str, Any]:
    with transaction(state.sessions) as session:
        key = _new(session, session_id, state)
    base = str(request.base_url).rstrip("/")
    out: dict[str, Any] = {"session_id": session_id, "status": "created", "base_url": f"{base}/{session_id}/v1"}
    if state.settings.proxy.verl_harness_key is None:
        out["api_key"] = key
    return out


@router.get(
    "/{session_id}",
    operation_id="verl_get_session",
    responses=error_responses(401, 404, 409, 422),
    summary="verl: a session's record (verl's SessionRecord, with the farm's token-exact record)",
)
def get_session(
    session_id: SessionId,
    db: DB,
    messages: Annotated[
        Literal["full", "delta"], Query(description="each turn's whole request, or what it added")
    ] = "full",
) -> dict[str, Any]:
    trial = _get(db, session_id)
    calls = store.calls(db, session_id)
    segs = [
        {
            "index": s.index,
            "calls": s.calls,
            "num_tokens": len(s.token_ids),
            "token_ids": encode_ids(s.token_ids.tobytes(), "json"),
            "logprobs": encode_logprobs(s.logprobs.tobytes(), "json"),
            "loss_mask": encode_mask(s.loss_mask.tobytes(), "json"),
            "spans": s.spans,
            "weight_versions": s.weight_versions,
        }
        for s in record.segments(calls)
    ]
    return {
        "session_id": session_id,
        "turns": _turns(calls, delta=messages == "delta"),
        "created_at": trial.created_at.timestamp(),
        "completed": trial.ended_at is not None,
        "farm": {
            **record.summary(trial),
            "certificate": [record.certificate(c) for c in calls],
            "segment_tokens": segs,
        },
    }


@router.post(
    "/{session_id}/complete",
    operation_id="verl_complete_session",
    responses=error_responses(401, 404, 409, 422),
    summary="verl: complete a session (ends the trial, releases its backend)",
)
def complete(session_id: SessionId, state: State) -> dict[str, Any]:
    with transaction(state.sessions) as session:
        _get(session, session_id)
        store.end(session, session_id)
    state.balancer.release(trial_balancer_key(session_id))
    return {"session_id": session_id, "status": "completed"}


@router.post(
    "/{session_id}/reset",
    operation_id="verl_reset_session",
    responses=error_responses(401, 404, 409, 422),
    summary="verl: forget a session's calls before a retry (the trial stays open, with its key)",
)
def reset(session_id: SessionId, state: State) -> dict[str, Any]:
    with transaction(state.sessions) as session:
        trial = _get(session, session_id)
        if trial.ended_at is not None:
            raise TrialEnded(f"trial {session_id!r} has ended; register a new session", trial_id=session_id)
        # One statement: loading every call (its token arrays) only to delete it would read the record.
        session.execute(delete_rows(TrialCall).where(TrialCall.trial_id == session_id))
        trial.calls = trial.segments = 0
        trial.incomplete = None
    state.balancer.release(trial_balancer_key(session_id))
    return {"session_id": session_id, "status": "reset"}


@router.delete(
    "/{session_id}",
    operation_id="verl_delete_session",
    responses=error_responses(401, 409, 422),
    summary="verl: delete a session and its record (an unknown one is already gone)",
)
def delete(session_id: SessionId, state: State) -> dict[str, Any]:
    # verl deletes in a `finally` and after a failed retry: its own proxy answers 200 either way.
    with transaction(state.sessions) as session:
        if session.get(Trial, session_id) is not None:
            session.delete(_get(session, session_id))
    state.balancer.release(trial_balancer_key(session_id))
    return {"session_id": session_id, "status": "deleted"}


def _assistant(reply: dict[str, Any]) -> dict[str, Any]:
    """The reply as a chat template reads an assistant message (arguments as objects)."""
    out: dict[str, Any] = {"role": "assistant", "content": reply.get("content", "")}
    if reply.get("tool_calls"):
        out["tool_calls"] = [
            {"id": c["id"], "type": "function", "function": {"name": c["name"], "arguments": _value(c["arguments"])}}
            for c in reply["tool_calls"]
        ]
    return out


def _value(arguments: str) -> Any:
    try:
        return json.loads(arguments)
    except ValueError:
        return arguments


def _turns(calls: list[TrialCall], *, delta: bool) -> list[dict[str, Any]]:
    """One verl ``CompletionRecord`` per answered call, in the order the calls began."""
    done = {c.seq: c for c in calls if c.state == "done"}
    full: dict[int, list[dict[str, Any]]] = {}
    turns: list[dict[str, Any]] = []
    stored = 0  # the remote_agent recipe's count: the messages its turns hold so far
    for call in sorted(done.values(), key=lambda c: c.seq):
        own = list(call.messages or [])
        parent = done.get(call.parent_seq) if call.parent_seq is not None else None
        # The parent's request and the reply it gave are this request's first messages.
        request = [*full[parent.seq], _assistant(parent.reply or {}), *own] if parent is not None else own
        full[call.seq] = request
        reply = call.reply or {}
        shown = request
        if delta and turns:
            # As that recipe stores them: what was added; nothing for a repeat; all of a shorter history.
            shown = request[stored:] if len(request) >= stored else request
        stored += len(shown)
        turns.append(
            {
                "request_messages": shown,
                "completion_text": reply.get("content", ""),
                "completion_token_ids": _ints(call.sampled_ids),
                "completion_logprobs": _floats(call.logprobs),
                "finish_reason": call.finish_reason,
                "tool_calls": [
                    {"id": c["id"], "type": "function", "function": {"name": c["name"], "arguments": c["arguments"]}}
                    for c in reply.get("tool_calls") or []
                ]
                or None,
                "timing": {
                    k: v for k, v in (("first_token_s", call.first_token_s), ("latency_s", call.latency_s)) if v
                },
                "worker_id": call.backend_id,
                "seq": call.seq,
                "segment": call.segment,
            }
        )
    return turns


def _ints(raw: bytes) -> list[int]:
    return [int(x) for x in np.frombuffer(raw, dtype=INT32)]


def _floats(raw: bytes) -> list[float]:
    return [float(x) for x in np.frombuffer(raw, dtype=FLOAT32)]
