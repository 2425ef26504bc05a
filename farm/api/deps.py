"""Request dependencies: the app's state, a database session, the bearer-token check."""

from __future__ import annotations

import secrets
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Annotated, Any, get_args, get_origin

import redis
from celery import Celery
from fastapi import Depends, HTTPException, Path, Request
from fastapi.exceptions import RequestValidationError
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer
from sqlalchemy import Engine
from sqlalchemy.orm import Session, sessionmaker

from farm.api.events import FinishNotifier
from farm.config import Settings
from farm.llm.balancer import Balancer

#: ids are 64-bit integers in the database (PostgreSQL bigint); a larger one names nothing and is
#: refused as invalid (422) before it reaches a query, where it would overflow.
MAX_ID = 2**63 - 1
BatchId = Annotated[int, Path(ge=1, le=MAX_ID, description="a batch id, as POST /v1/batches returned it")]
JobId = Annotated[int, Path(ge=1, le=MAX_ID, description="a job id, one of a batch's job_ids")]


@dataclass
class AppState:
    settings: Settings
    engine: Engine
    sessions: sessionmaker[Session]
    redis: redis.Redis
    celery: Celery
    notifier: FinishNotifier
    balancer: Balancer


# The dependencies that do no I/O are coroutines: FastAPI runs a plain function dependency in
# its thread pool, a hop to a worker thread and back for every request.
async def get_state(request: Request) -> AppState:
    state: AppState = request.app.state.farm
    return state


State = Annotated[AppState, Depends(get_state)]


def get_session(state: State) -> Iterator[Session]:
    with state.sessions() as session:
        yield session


DB = Annotated[Session, Depends(get_session)]

bearer_scheme = HTTPBearer(auto_error=False, description="the farm's API token (FARM_API__TOKEN)")


async def require_token(
    state: State, credentials: Annotated[HTTPAuthorizationCredentials | None, Depends(bearer_scheme)]
) -> None:
    token = state.settings.api.token
    assert token is not None  # create_app refuses to start without one
    if credentials is None:
        raise HTTPException(401, "missing bearer token: send 'Authorization: Bearer <FARM_API__TOKEN>'")
    if not secrets.compare_digest(credentials.credentials.encode(), token.get_secret_value().encode()):
        raise HTTPException(401, "invalid bearer token")


#: a query string parameter's pattern: anything but NUL, which no PostgreSQL text can hold (the
#: schema says so; ``single_valued_query`` refuses one in any parameter, declared or not).
NO_NUL = r"^[^\x00]*$"


async def single_valued_query(request: Request) -> None:
    """A query parameter declared as one value but given several times (``?type=a&type=b``) is a
    422 naming it: FastAPI would quietly take the last one. So is a NUL character in any query
    value: no PostgreSQL text can hold one."""
    items = request.query_params.multi_items()
    for name, value in items:
        if "\x00" in value:
            raise RequestValidationError(
                [{"type": "nul", "loc": ("query", name), "msg": "holds a NUL character, which no text may hold"}]
            )
    dependant = getattr(request.scope.get("route"), "dependant", None)
    if dependant is None or len(items) < 2:
        return
    for param in _query_params(dependant):
        count = len(request.query_params.getlist(param.alias))
        if count > 1 and not _takes_many(param.field_info.annotation):
            raise RequestValidationError(
                [{"type": "repeated", "loc": ("query", param.alias), "msg": f"given {count} times; give it once"}]
            )


def _query_params(dependant: Any) -> Iterator[Any]:
    """The query parameters of a route and of every dependency under it."""
    yield from dependant.query_params
    for sub in dependant.dependencies:
        yield from _query_params(sub)


def _takes_many(annotation: Any) -> bool:
    """list[str], list[str] | None and the like: a parameter that may be repeated."""
    if get_origin(annotation) in (list, tuple, set, frozenset, Sequence):
        return True
    return any(_takes_many(arg) for arg in get_args(annotation) if arg is not type(None))
