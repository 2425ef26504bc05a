"""FarmError -> HTTP status, and one error body shape (``ErrorOut``) for every failure.

``error_responses`` documents those statuses in the OpenAPI spec with the same ``ErrorOut`` model,
so the spec promises the body the API really sends (never FastAPI's ``HTTPValidationError``).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Sequence
from typing import Any

import redis
from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from sqlalchemy.exc import InterfaceError, OperationalError
from sqlalchemy.exc import TimeoutError as PoolTimeout
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.routing import Match
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from farm.batches import submit
from farm.errors import HTTP_ERRORS, FarmError, Problem
from farm.handlers.base import error_message, field_path
from farm.proxy.errors import any_sdk_error_body, is_harness_path
from farm.schemas import ErrorOut
from farm.schemas.stored import NO_NUL_PATTERN

log = logging.getLogger(__name__)


#: what each error status means, as the OpenAPI spec describes it.
ERROR_DESCRIPTIONS: dict[int, str] = {
    401: "Missing or invalid bearer token (send 'Authorization: Bearer <FARM_API__TOKEN>')",
    404: "No such resource",
    409: "Conflict: an idempotency key reused with another request body",
    413: "Request body larger than api.max_body_bytes",
    422: "Invalid request: `field` names what to fix",
    502: "An LLM backend failed to do its part (its error in `detail`)",
    503: "The database or Redis is unreachable; retry shortly",
}


def error_responses(*statuses: int) -> dict[int | str, dict[str, Any]]:
    """OpenAPI ``responses`` for these error statuses, all with the ``ErrorOut`` body."""
    return {status: {"model": ErrorOut, "description": ERROR_DESCRIPTIONS[status]} for status in statuses}


def error_response(
    status: int,
    code: str,
    detail: str,
    field: str | None = None,
    headers: dict[str, str] | None = None,
    errors: list[Problem] | None = None,
) -> JSONResponse:
    body = ErrorOut.model_validate({"code": code, "detail": detail, "field": field, "errors": errors}).model_dump(
        exclude_none=True
    )
    headers = dict(headers or {})
    if status == 401:
        headers["WWW-Authenticate"] = "Bearer"
    return JSONResponse(body, status_code=status, headers=headers or None)


def _farm_error(_: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, FarmError)
    for cls, status, code in HTTP_ERRORS:
        if isinstance(exc, cls):
            field = getattr(exc, "field", None)
            errors = getattr(exc, "errors", None) or ([{"field": field, "detail": exc.message}] if field else None)
            return error_response(status, code, exc.message, field, errors=errors)
    log.error("unhandled farm error: %s", exc)
    return error_response(503, "unavailable", exc.message)


def _json_error_message(request: Request, error: Any) -> str:
    """Where a body that is not JSON broke, as line and column: pydantic gives only the character
    offset, which reads like a field name in the answer."""
    loc = error.get("loc", ())
    offset = loc[1] if len(loc) > 1 and isinstance(loc[1], int) else None
    reason = (error.get("ctx") or {}).get("error") or "not valid JSON"
    if offset is None:
        return f"body: not valid JSON ({reason})"
    body = getattr(request, "_body", b"")
    text = body.decode("utf-8", "replace") if isinstance(body, bytes) else ""
    line = text.count("\n", 0, offset) + 1
    column = offset - (text.rfind("\n", 0, offset) + 1) + 1
    return f"body: not valid JSON at line {line} column {column} (character {offset}): {reason}"


def _validation_error(request: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, RequestValidationError)
    errors = exc.errors()
    first = errors[0] if errors else {"loc": (), "msg": "invalid request"}
    if first.get("type") == "json_invalid":
        return error_response(422, "invalid_request", _json_error_message(request, first), "body")
    problems: list[Problem] = []
    for error in errors:
        problem = {"field": _request_field(error.get("loc", ())), "detail": _message(error)}
        if problem not in problems:  # a union's members each report the same input
            problems.append(problem)
    if request.method == "POST" and request.url.path.rstrip("/") == "/v1/batches":
        # The tasks' own configs are checked by their handlers after the schema passes: check those
        # that can be read now too, so one answer lists every problem of the batch.
        body = exc.body if isinstance(exc.body, dict) else {}
        tasks = body.get("tasks")
        if isinstance(tasks, list):
            problems += [p for p in submit.task_problems(tasks) if p not in problems]
    head = problems[0] if problems else {"field": "body", "detail": "invalid request"}
    more = f" (and {len(problems) - 1} more)" if len(problems) > 1 else ""
    return error_response(
        422, "invalid_request", f"{head['field']}: {head['detail']}{more}", head["field"], errors=problems or None
    )


def _request_field(loc: Sequence[int | str]) -> str:
    """Where a request error is, as a dotted path: ``sampling.temperature`` for the body's fields (the
    ``body`` prefix dropped, and pydantic's names of union members), ``query.limit``, or ``body``."""
    parts = list(loc)
    if parts[:1] == ["body"] and len(parts) > 1:
        parts = parts[1:]
    return field_path(parts) or "body"


def _message(error: Any) -> str:
    """pydantic's message, but what makes a text unstorable (``farm.schemas.stored``) said plainly:
    its own messages quote the pattern, or call the text no string."""
    if error.get("type") == "string_unicode":
        return "holds an unpaired UTF-16 surrogate (half of a pair), which is no text; send valid Unicode"
    if error.get("type") == "string_pattern_mismatch" and (error.get("ctx") or {}).get("pattern") == NO_NUL_PATTERN:
        return "holds a NUL character, which no stored text may hold"
    return error_message(error)


#: methods an ``Allow`` header may name.
_METHODS = ("DELETE", "GET", "HEAD", "OPTIONS", "PATCH", "POST", "PUT")


def _allowed_methods(request: Request) -> str:
    """Every method some route serves at this path. Starlette's own ``Allow`` names only the first
    route that matched the path, though GET and POST of one path are two routes here."""
    routes = request.app.router.routes
    allowed = [
        method
        for method in _METHODS
        if any(route.matches({**request.scope, "method": method})[0] is Match.FULL for route in routes)
    ]
    return ", ".join(allowed)


def _http_error(request: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, StarletteHTTPException)
    code = {401: "unauthorized", 404: "not_found", 405: "method_not_allowed", 413: "body_too_large"}
    headers = dict(exc.headers or {})
    detail = str(exc.detail)
    if exc.status_code == 400:
        # FastAPI's answer to a body it cannot decode (not UTF-8, say): bad input like any other, so
        # the same 422 as a malformed JSON body.
        return error_response(422, "invalid_request", f"body: {detail}; send JSON encoded as UTF-8", "body")
    if exc.status_code == 405:
        headers["Allow"] = _allowed_methods(request)
        detail = f"{request.method} is not allowed on {request.url.path}; allowed: {headers['Allow']}"
    if is_harness_path(request.url.path):  # a harness's SDK reads its own error shape, not the API's
        if exc.status_code == 404:
            routes = "chat/completions, completions, responses, messages, messages/count_tokens, models"
            detail = f"no route {request.url.path}: a trial's base URL serves {routes}"
        body = any_sdk_error_body(exc.status_code, detail, code.get(exc.status_code, "http_error"))
        return JSONResponse(body, status_code=exc.status_code, headers=headers)
    return error_response(exc.status_code, code.get(exc.status_code, "http_error"), detail, headers=headers)


def _database_error(_: Request, exc: Exception) -> JSONResponse:
    log.warning("database error: %s", exc)
    return error_response(503, "database_unavailable", "the database is unreachable or restarting; retry shortly")


def _redis_error(_: Request, exc: Exception) -> JSONResponse:
    log.warning("redis error: %s", exc)
    return error_response(503, "redis_unavailable", "Redis is unreachable or restarting; retry shortly")


def install_error_handlers(app: FastAPI) -> None:
    app.add_exception_handler(FarmError, _farm_error)
    app.add_exception_handler(RequestValidationError, _validation_error)
    app.add_exception_handler(StarletteHTTPException, _http_error)
    app.add_exception_handler(OperationalError, _database_error)
    # No free connection in the pool for pool_timeout_s, a connection lost: the same wait-and-retry answer.
    app.add_exception_handler(PoolTimeout, _database_error)
    app.add_exception_handler(InterfaceError, _database_error)
    app.add_exception_handler(redis.RedisError, _redis_error)


class BodyLimitMiddleware:
    """Refuse request bodies over ``max_bytes`` with 413 before they are read into memory, and
    bodies not received within ``read_timeout_s`` with 408 (a client trickling its bytes would
    hold a socket and a buffer for ever; its headers' deadline is ``farm.cli.process``'s)."""

    def __init__(self, app: ASGIApp, *, max_bytes: int, read_timeout_s: float) -> None:
        self.app, self.max_bytes, self.read_timeout_s = app, max_bytes, read_timeout_s

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        declared = dict(scope["headers"]).get(b"content-length")
        if declared is not None and declared.isdigit() and int(declared) > self.max_bytes:
            await self._too_large(scope, receive, send)
            return
        seen = 0
        refused: _Refused | None = None
        body_read = False
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.read_timeout_s

        async def counting_receive() -> Message:
            nonlocal seen, refused, body_read
            if body_read:  # a route waiting for the client to leave (a stream, a long-poll) waits on
                return await receive()
            try:
                message = await asyncio.wait_for(receive(), max(0.0, deadline - loop.time()))
            except TimeoutError:
                refused = _TooSlow()
                raise refused from None
            body_read = message["type"] != "http.request" or not message.get("more_body", False)
            seen += len(message.get("body", b""))
            if seen > self.max_bytes:
                refused = _TooLarge()
                raise refused
            return message

        async def send_unless_refused(message: Message) -> None:
            # FastAPI answers any error while reading a body (ours included) with a 400 of its own:
            # once the body is refused, only the 413 goes out.
            if refused is None:
                await send(message)

        with contextlib.suppress(_Refused):
            await self.app(scope, counting_receive, send_unless_refused)
        if isinstance(refused, _TooLarge):
            await self._too_large(scope, receive, send)
        elif refused is not None:
            detail = f"the request body was not sent within {self.read_timeout_s} s (api.read_timeout_s)"
            await error_response(408, "request_timeout", detail, headers={"Connection": "close"})(scope, receive, send)

    async def _too_large(self, scope: Scope, receive: Receive, send: Send) -> None:
        detail = f"request body is larger than {self.max_bytes} bytes; split the batch into smaller submissions"
        await error_response(413, "body_too_large", detail)(scope, receive, send)


class _Refused(Exception):
    """A body the middleware refused while the app was reading it."""


class _TooLarge(_Refused):
    pass


class _TooSlow(_Refused):
    pass
