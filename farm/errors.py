"""Every exception farm shares, in one place.

::

    FarmError
    ├─ ConfigError                      settings or a plug-in is mis-configured
    ├─ NotFound
    │   ├─ BatchNotFound, JobNotFound, TrajectoryNotFound
    │   └─ HandlerNotFound              unknown task type (lists the known ones)
    ├─ InvalidSpec                      a task spec or request a handler refuses (names the field)
    ├─ Conflict                         e.g. an idempotency key reused with another body
    ├─ InvalidTransition                illegal job state change
    ├─ ClaimLost                        the database lost a stage's claim (crashed before writing it)
    ├─ SandboxError                     the sandbox (not the agent) failed
    │   ├─ SandboxTimeout
    │   └─ SandboxUnavailable
    ├─ UpstreamError                    the LLM backend failed
    │   ├─ UpstreamTimeout
    │   ├─ UpstreamStatusError(status)
    │   ├─ UpstreamConnectError         never reached the backend: safe to send elsewhere
    │   └─ NoBackendAvailable
    └─ ApiError(status, code, detail)   raised by farm.client for an HTTP error answer

    Retry(delay_s)                      control flow: re-run the stage later
    Shutdown(BaseException)             unswallowable: the worker is going away

The policy failing (wrong answer, failing tests, a bad tool call) is a *result*, never
an exception. Raise only when infrastructure fails; ``outcome`` says how a job that
dies of the exception is reported.
"""

from __future__ import annotations

from typing import Any


class FarmError(Exception):
    """Base of every farm error. ``outcome`` is the job outcome it maps to."""

    outcome: str = "infra_error"

    def __init__(self, message: str, **context: Any) -> None:
        super().__init__(message)
        self.message = message
        self.context = context

    def __str__(self) -> str:
        if not self.context:
            return self.message
        ctx = ", ".join(f"{k}={v!r}" for k, v in self.context.items())
        return f"{self.message} ({ctx})"


class ConfigError(FarmError):
    """Settings or a plug-in are mis-configured."""


class NotFound(FarmError):
    """A resource that was asked for does not exist."""


class BatchNotFound(NotFound):
    """No batch with that id."""


class JobNotFound(NotFound):
    """No job with that id."""


class TrajectoryNotFound(NotFound):
    """The job has no trajectory (yet, or because it failed before RUN ended)."""


class HandlerNotFound(NotFound):
    """No handler is registered under that task type."""

    outcome = "handler_error"

    def __init__(self, message: str, *, field: str | None = None, **context: Any) -> None:
        super().__init__(message, **context)
        self.field = field


class InvalidSpec(FarmError):
    """A request or task spec is invalid; the message names the field to fix."""

    def __init__(self, message: str, *, field: str | None = None, **context: Any) -> None:
        super().__init__(message, **context)
        self.field = field


class Conflict(FarmError):
    """The request conflicts with the current state of a resource."""


class InvalidTransition(FarmError):
    """A job was asked to move between two states that are not connected."""


class ClaimLost(FarmError):
    """The database no longer has this worker's claim of a stage: it restarted before the claim
    (committed without waiting for the disk) was written. Deliver the stage message again."""


class SandboxError(FarmError):
    """The sandbox failed (not the agent inside it)."""

    outcome = "sandbox_error"


class SandboxTimeout(SandboxError):
    """A sandbox operation (not an agent command) exceeded its time limit."""


class SandboxUnavailable(SandboxError):
    """The sandbox runtime is missing or refused to start."""


class UpstreamError(FarmError):
    """An LLM backend failed."""


class UpstreamTimeout(UpstreamError):
    """An LLM backend did not answer in time."""


class UpstreamStatusError(UpstreamError):
    """An LLM backend answered with an HTTP error status."""

    def __init__(self, message: str, *, status: int, **context: Any) -> None:
        super().__init__(message, status=status, **context)
        self.status = status


class ContextLengthExceeded(UpstreamStatusError):
    """The prompt does not fit the model's context: the policy's conversation grew too long, not a fault."""


class UpstreamConnectError(UpstreamError):
    """No connection to the LLM backend: the request never reached it, so it may go to another one."""


class NoBackendAvailable(UpstreamError):
    """The balancer has no healthy backend to hand out."""


class ApiError(FarmError):
    """The farm API answered with an error; raised by ``farm.client``."""

    def __init__(self, status: int, code: str, detail: str) -> None:
        super().__init__(f"{status} {code}: {detail}")
        self.status = status
        self.code = code
        self.detail = detail


class Retry(Exception):  # noqa: N818 - control flow, named like dramatiq/arq
    """Re-run the current stage after ``delay_s`` seconds (counts as an attempt)."""

    def __init__(self, reason: str, *, delay_s: float | None = None) -> None:
        super().__init__(reason)
        self.reason = reason
        self.delay_s = delay_s


class Shutdown(BaseException):  # noqa: N818 - like rq's, must not be swallowed by `except Exception`
    """The worker is shutting down; unwind without recording a result."""
