"""LLM backends in the balancer, added and removed at run time."""

from __future__ import annotations

import hashlib
import re
from dataclasses import asdict
from typing import Annotated, Any

import httpx
from fastapi import APIRouter, Path, Response

from farm.api.deps import State
from farm.api.errors import error_responses
from farm.db import backends as registry
from farm.db.session import transaction
from farm.errors import NotFound
from farm.llm.balancer import Backend
from farm.schemas import BACKEND_ID_PATTERN, BackendCreate, BackendOut

router = APIRouter(prefix="/v1/backends", tags=["backends"])

#: an id given at POST (up to 200 characters) or derived from the URL (up to its 2,000).
BackendId = Annotated[str, Path(min_length=1, max_length=2000, pattern=BACKEND_ID_PATTERN)]
ERRORS = error_responses(404, 422)
_BACKEND = {"backend_id": "$response.body#/id"}
BACKEND_LINKS: dict[str, Any] = {
    "GetBackend": {"operationId": "get_backend", "parameters": _BACKEND, "description": "the backend added"},
    "RemoveBackend": {"operationId": "remove_backend", "parameters": _BACKEND, "description": "remove it"},
}


def backend_out(backend: Backend) -> BackendOut:
    fields = asdict(backend)
    fields["kind"] = str(backend.kind)
    return BackendOut(**fields, context_tokens=context_tokens(backend))


#: how long the API waits for a backend's model listing (once per backend and URL).
CONTEXT_TIMEOUT_S = 1.0
#: (backend id, url) -> the context length its ``/v1/models`` said (None: it said none).
_contexts: dict[tuple[str, str], int | None] = {}


def context_tokens(backend: Backend) -> int | None:
    """The served model's context length (``max_model_len`` of its ``/v1/models``, as vLLM and the
    built-in backend say it), read once per backend and URL; None while it cannot be read."""
    key = (backend.id, backend.url)
    if key in _contexts:
        return _contexts[key]
    try:
        answer = httpx.get(f"{backend.url.rstrip('/')}/v1/models", timeout=CONTEXT_TIMEOUT_S)
        answer.raise_for_status()
        lengths = [m.get("max_model_len") for m in answer.json().get("data", []) if isinstance(m, dict)]
    except (httpx.HTTPError, ValueError, AttributeError):
        return None  # asked again next time: the backend may be starting
    found = min((n for n in lengths if isinstance(n, int) and n > 0), default=None)
    _contexts[key] = found
    return found


#: the longest backend id (the database column's length).
MAX_ID = 200


def _default_id(url: str) -> str:
    """The URL without its scheme, each character an id may not hold a dash; a long one keeps its
    start and a hash of the whole, so two long URLs never share an id."""
    name = re.sub(r"[^A-Za-z0-9._:@-]", "-", url.split("://", 1)[-1].rstrip("/"))
    if len(name) <= MAX_ID:
        return name
    return f"{name[: MAX_ID - 17]}-{hashlib.sha256(url.encode()).hexdigest()[:16]}"


@router.get(
    "", operation_id="list_backends", response_model=list[BackendOut], summary="Backends with their load and health"
)
def list_backends(state: State) -> list[BackendOut]:
    return [backend_out(b) for b in state.balancer.backends()]


@router.post(
    "",
    status_code=201,
    operation_id="add_backend",
    response_model=BackendOut,
    responses={201: {"links": BACKEND_LINKS}, **error_responses(413, 422)},
    summary="Add a backend (or update one with the same id); other jobs keep their backends",
)
def add_backend(body: BackendCreate, state: State) -> BackendOut:
    fields: dict[str, Any] = {
        "backend_id": body.id or _default_id(body.url),
        "url": body.url.rstrip("/"),
        "kind": body.kind,
        "model": body.model,
        "capacity": body.capacity,
        "weight_version": body.weight_version,
    }
    # Recorded in the database too (the balancer's set is rebuilt from it if Redis loses it), in a
    # transaction that a backend the balancer refuses (a URL no request can be sent to) rolls back.
    with transaction(state.sessions) as session:
        registry.save(session, **fields)
        backend = state.balancer.add_backend(**fields)
    return backend_out(backend)


@router.get("/{backend_id}", operation_id="get_backend", response_model=BackendOut, responses=ERRORS)
def get_backend(backend_id: BackendId, state: State) -> BackendOut:
    backend = state.balancer.get_backend(backend_id)
    if backend is None:
        raise NotFound(f"no backend with id {backend_id!r}")
    return backend_out(backend)


@router.delete(
    "/{backend_id}",
    status_code=204,
    operation_id="remove_backend",
    responses=ERRORS,
    summary="Remove a backend; its jobs move to another on their next turn",
)
def remove_backend(backend_id: BackendId, state: State) -> Response:
    with transaction(state.sessions) as session:
        known = registry.remove(session, backend_id)
    if not state.balancer.remove_backend(backend_id) and not known:
        raise NotFound(f"no backend with id {backend_id!r}")
    return Response(status_code=204)
