"""Failures as the proxy answers them: a status, a message that says what to fix, and the
field at fault. Each wire format writes a ``ProxyError`` in its own error shape."""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator
from typing import Any, TypeVar

from pydantic import BaseModel, ValidationError

from farm.errors import (
    ContextLengthExceeded,
    FarmError,
    InvalidSpec,
    NoBackendAvailable,
    ProxyError,
    TemplateRefused,
    TrialEnded,
    TrialNotFound,
    Unauthorized,
    UpstreamError,
    UpstreamStatusError,
    UpstreamTimeout,
)

#: the ``code`` of an error a harness should answer by shortening (compacting) its history.
CONTEXT_LENGTH = "context_length_exceeded"

T = TypeVar("T")
M = TypeVar("M", bound=BaseModel)
log = logging.getLogger(__name__)


def is_harness_path(path: str) -> bool:
    """A path under a trial's base URL (``/proxy/{trial}/v1/...``, or verl's ``/{trial}/v1/...``)."""
    parts = path.split("/")
    return len(parts) > 2 and (parts[1] == "proxy" or (parts[2] == "v1" and parts[1] != "v1"))


def any_sdk_error_body(status: int, message: str, code: str) -> dict[str, Any]:
    """An error both the openai and the anthropic SDKs read, for an answer no route of one format
    gave (an unknown route, a method a route does not take)."""
    kinds = {401: "authentication_error", 404: "not_found_error", 405: "invalid_request_error"}
    kind = kinds.get(status, "invalid_request_error" if status < 500 else "api_error")
    return {"type": "error", "error": {"type": kind, "message": message, "param": None, "code": code}}


def validated(model: type[M], raw: Any, *, prefix: str = "invalid request: ") -> M:
    """``raw`` read as ``model``.

    Raises:
        ProxyError: 400 naming the first field at fault (``body`` for a body that is no JSON object).
    """
    try:
        return model.model_validate(raw)
    except ValidationError as exc:
        raise invalid(exc, prefix=prefix) from exc


def invalid(exc: ValidationError, *, prefix: str = "invalid request: ") -> ProxyError:
    """A 400 naming the first field at fault (``body`` for the body as a whole)."""
    first = exc.errors()[0]
    where = ".".join(str(p) for p in first["loc"]) or "body"
    return ProxyError(400, f"{prefix}{where}: {first['msg']}", param=where)


def unexpected(exc: Exception) -> ProxyError:
    """A bug, answered as the format's 500 (never a bare one, which also drops the connection)."""
    log.exception("proxy call failed")
    return ProxyError(500, f"internal error in the proxy: {type(exc).__name__}", code="internal_error")


def proxy_error(exc: FarmError) -> ProxyError:
    """The answer for a farm error raised while serving a call."""
    message = getattr(exc, "message", None) or str(exc)
    if isinstance(exc, Unauthorized):
        return ProxyError(401, message, code="invalid_api_key")
    if isinstance(exc, TrialNotFound):
        return ProxyError(404, message, code="trial_not_found")
    if isinstance(exc, TrialEnded):
        return ProxyError(403, f"{message}; start a new trial", code="trial_ended")
    if isinstance(exc, InvalidSpec):
        return ProxyError(400, message, param=getattr(exc, "field", None))
    if isinstance(exc, ContextLengthExceeded):
        return ProxyError(400, message, param="messages", code=CONTEXT_LENGTH)
    if isinstance(exc, NoBackendAvailable):
        return ProxyError(503, f"no LLM backend available: {message}", code="overloaded")
    if isinstance(exc, UpstreamTimeout):
        return ProxyError(504, f"the LLM backend timed out: {message}", code="upstream_timeout")
    if isinstance(exc, UpstreamStatusError) and exc.status == 400 and "context length" in message.lower():
        return ProxyError(400, message, param="messages", code=CONTEXT_LENGTH)
    if isinstance(exc, UpstreamError):
        return ProxyError(502, f"the LLM backend failed: {message}", code="upstream_error")
    return ProxyError(500, message, code="internal_error")


def refused(exc: TemplateRefused) -> ProxyError:
    """A conversation the chat template will not render (Llama 3.1's takes one tool call per reply):
    the harness's to change, so a 400 with the template's own words, not a 500."""
    return ProxyError(400, str(exc), param="messages", code="template_refused")


async def translated(events: AsyncIterator[T]) -> AsyncIterator[T]:
    """``events`` with every failure turned into a ProxyError (a bug is a 500 in the format's shape)."""
    try:
        async for event in events:
            yield event
    except ProxyError:
        raise
    except FarmError as exc:
        raise proxy_error(exc) from exc
    except TemplateRefused as exc:
        raise refused(exc) from exc
    except Exception as exc:
        raise unexpected(exc) from exc
