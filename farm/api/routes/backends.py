"""LLM backends in the balancer, added and removed at run time."""

from __future__ import annotations

import re
from dataclasses import asdict
from typing import Any

from fastapi import APIRouter, Response

from farm.api.deps import State
from farm.db import backends as registry
from farm.db.session import transaction
from farm.errors import NotFound
from farm.llm.balancer import Backend
from farm.schemas import BackendCreate, BackendOut, ErrorOut

router = APIRouter(prefix="/v1/backends", tags=["backends"])


def _out(backend: Backend) -> BackendOut:
    fields = asdict(backend)
    fields["kind"] = str(backend.kind)
    return BackendOut(**fields)


def _default_id(url: str) -> str:
    return re.sub(r"[^A-Za-z0-9._:@-]", "-", url.split("://", 1)[-1].rstrip("/"))


@router.get("", response_model=list[BackendOut], summary="Backends with their load and health")
def list_backends(state: State) -> list[BackendOut]:
    return [_out(b) for b in state.balancer.backends()]


@router.post(
    "",
    status_code=201,
    response_model=BackendOut,
    responses={422: {"model": ErrorOut}},
    summary="Add a backend (or update one with the same id); other jobs keep their backends",
)
def add_backend(body: BackendCreate, state: State) -> BackendOut:
    fields: dict[str, Any] = {
        "backend_id": body.id or _default_id(body.url),
        "url": body.url.rstrip("/"),
        "kind": body.kind,
        "model": body.model,
        "capacity": body.capacity,
    }
    # The database first: the balancer's set is rebuilt from it if Redis loses it.
    with transaction(state.sessions) as session:
        registry.save(session, **fields)
    return _out(state.balancer.add_backend(**fields))


@router.get("/{backend_id}", response_model=BackendOut, responses={404: {"model": ErrorOut}})
def get_backend(backend_id: str, state: State) -> BackendOut:
    backend = state.balancer.get_backend(backend_id)
    if backend is None:
        raise NotFound(f"no backend with id {backend_id!r}")
    return _out(backend)


@router.delete(
    "/{backend_id}",
    status_code=204,
    responses={404: {"model": ErrorOut}},
    summary="Remove a backend; its jobs move to another on their next turn",
)
def remove_backend(backend_id: str, state: State) -> Response:
    with transaction(state.sessions) as session:
        known = registry.remove(session, backend_id)
    if not state.balancer.remove_backend(backend_id) and not known:
        raise NotFound(f"no backend with id {backend_id!r}")
    return Response(status_code=204)
