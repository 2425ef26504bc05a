"""Every exception farm shares, in one place.

::

    FarmError
    ├─ ConfigError                      settings or a plug-in is mis-configured
    │   └─ FamiliesMissing              the model families cache is not set up (scripts/setup_families.sh)
    ├─ NotFound
    │   ├─ BatchNotFound, JobNotFound, TrajectoryNotFound
    │   ├─ TrialNotFound                (farm.trials) no trial has the id
    │   ├─ WeightUpdateNotFound
    │   └─ HandlerNotFound              unknown task type (lists the known ones)
    ├─ InvalidSpec                      a task spec or request a handler refuses (names the field, and
    │                                   in ``errors`` every problem found, as ``{field, detail}``)
    │   └─ EngineRequestError           (also a ValueError) the built-in backend refuses a prompt: 400
    ├─ Conflict                         e.g. an idempotency key reused with another body
    │   └─ TrialEnded                   (farm.trials) the trial takes no more calls
    ├─ InvalidTransition                illegal job state change
    ├─ ClaimLost                        the database lost a stage's claim (crashed before writing it)
    ├─ TaskSetupFailed                  a task's own setup failed: reported as handler_error
    ├─ SandboxError                     the sandbox (not the agent) failed
    │   ├─ SandboxTimeout
    │   ├─ SandboxUnavailable
    │   │   ├─ SandboxCheckFailed       the configured driver cannot start a sandbox on this node
    │   │   └─ DiskQuotaUnavailable     (also an OSError) no loop-mounted file system here
    │   └─ WireError                    the tool server's socket closed or sent a bad frame
    ├─ UpstreamError                    the LLM backend failed
    │   ├─ UpstreamTimeout
    │   ├─ UpstreamStatusError(status)
    │   │   └─ ContextLengthExceeded    the prompt outgrew the context: ends the episode, not a fault
    │   ├─ UpstreamConnectError         never reached the backend: safe to send elsewhere
    │   ├─ NoBackendAvailable
    │   │   └─ BackendsPaused           held for a weight update (proxy calls told to retry)
    │   ├─ BackendUnreachable           a backend cannot take part in a weight update (did nothing)
    │   └─ BackendCallFailed            a backend did not do its part of a weight update: 502
    ├─ VerifierError(kind)              (tasks.harbor) a task's verifier gave no reward
    ├─ NotReplayable                    the job holds no action record to run again
    ├─ ReverifyRefused(unsafe)          some rollouts' graders cannot score them again
    ├─ SampleFailed                     (farm.bridges) a job without a reward, not to be trained on
    ├─ Unauthorized, Unavailable        only from farm.client: a 401, a 503
    └─ ApiError(status, code, detail)   raised by farm.client for an HTTP error answer; each
                                        code maps to a subclass that is also the class above
                                        (``except NotFound`` catches a 404 from the API)

    Cancelled(Exception)                control flow, not a failure: the job was cancelled while its
                                        model call was in flight (the agent loop ends the episode)

    ProxyError(Exception)               a failure as the proxy answers a harness: status, message,
                                        field and code, written by each wire format in its own shape
    TemplateFork(Exception)             the chat template cannot extend a trial's history append-only
                                        (the proxy starts a new segment, and says why)
    TemplateRefused(Exception)          the chat template raised on a conversation (Llama 3.1 takes one
                                        call per reply; the agent loop ends the episode as agent_error)
    NoCallOpening(Exception)            the template writes no ``<tool_call>`` opening after a history
                                        (a forced tool call cannot be primed)

The policy failing (wrong answer, failing tests, a bad tool call) is a *result*, never
an exception. Raise only when infrastructure fails; ``outcome`` says how a job that
dies of the exception is reported. A handler raising a ``FarmError`` gets its stage again
after ``worker.retry_delay_s``, up to ``worker.max_attempts`` attempts.

Which exceptions live here: every one that leaves the module raising it (caught, mapped to an
HTTP code or an outcome, or tested for, anywhere else). An exception raised and caught inside one
module, as its own control flow, stays there, private (``_TooLarge`` in ``farm.api.errors``,
``_TestTimeout`` in ``tasks.code.harness``, ``EditorError`` in ``farm.tools.editor``).
``tests/unit/test_errors.py`` holds both halves of that rule.
"""

from __future__ import annotations

from typing import Any, Literal


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


class FamiliesMissing(ConfigError):
    """The model families cache has not been set up (run scripts/setup_families.sh)."""


class NotFound(FarmError):
    """A resource that was asked for does not exist."""


class BatchNotFound(NotFound):
    """No batch with that id."""


class JobNotFound(NotFound):
    """No job with that id."""


class TrajectoryNotFound(NotFound):
    """The job has no trajectory (yet, or because it failed before RUN ended)."""


class TrialNotFound(NotFound):
    """No trial has this id."""


#: one problem of a request: the field it is about (a dotted path, ``tasks.0.config.problem_id``)
#: and what is wrong with it.
Problem = dict[str, str]


class HandlerNotFound(NotFound):
    """No handler is registered under that task type."""

    outcome = "handler_error"

    def __init__(
        self, message: str, *, field: str | None = None, errors: list[Problem] | None = None, **context: Any
    ) -> None:
        super().__init__(message, **context)
        self.field = field
        self.errors = errors


class WeightUpdateNotFound(NotFound):
    """No weight update with that id."""


class InvalidSpec(FarmError):
    """A request or task spec is invalid; the message names the field to fix (the first problem),
    ``errors`` lists every problem found (``None``: only the one)."""

    def __init__(
        self, message: str, *, field: str | None = None, errors: list[Problem] | None = None, **context: Any
    ) -> None:
        super().__init__(message, **context)
        self.field = field
        self.errors = errors


class EngineRequestError(InvalidSpec, ValueError):
    """A request the built-in engine cannot run (prompt too long, token id out of range); its server answers 400."""


class Conflict(FarmError):
    """The request conflicts with the current state of a resource."""


class TrialEnded(Conflict):
    """The trial has ended: it takes no more calls."""


class InvalidTransition(FarmError):
    """A job was asked to move between two states that are not connected."""


class ClaimLost(FarmError):
    """The database no longer has this worker's claim of a stage: it restarted before the claim
    (committed without waiting for the disk) was written. Deliver the stage message again."""


class TaskSetupFailed(FarmError):
    """A task's own setup step (its ``setup`` script) failed or ran out of time: the task's fault,
    not the agent's; retried like any stage failure, then reported as ``handler_error``."""

    outcome = "handler_error"


class SandboxError(FarmError):
    """The sandbox failed (not the agent inside it)."""

    outcome = "sandbox_error"


class SandboxTimeout(SandboxError):
    """A sandbox operation (not an agent command) exceeded its time limit."""


class SandboxUnavailable(SandboxError):
    """The sandbox runtime is missing or refused to start."""


class SandboxCheckFailed(SandboxUnavailable):
    """The configured sandbox driver cannot start a sandbox here (a worker refuses to start)."""


class DiskQuotaUnavailable(SandboxUnavailable, OSError):
    """A loop-mounted file system could not be made here (not root, no loop device, no mkfs)."""


class WireError(SandboxError):
    """The tool server's peer closed the connection or sent a malformed frame."""


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


class BackendsPaused(NoBackendAvailable):
    """The backends are paused for a weight update and the trainer asked proxy calls to retry later."""


class BackendUnreachable(UpstreamError):
    """The backend cannot take part in a weight update: no connection could be made (refused, no
    such host, a URL no request can be sent to), or it has no such route (a vLLM started without
    ``VLLM_SERVER_DEV_MODE=1``, or not an inference server at all). Either way it did nothing."""


class BackendCallFailed(UpstreamError):
    """A backend did not do its part of a weight update (HTTP 502 at the API)."""


#: how a task's verifier failed to give a reward.
VerifierErrorKind = Literal["no_reward_file", "bad_reward", "timeout"]


class VerifierError(FarmError):
    """The verifier did not produce a reward (``kind`` says how); an infrastructure failure."""

    def __init__(self, message: str, *, kind: VerifierErrorKind, output: str = "", **context: Any) -> None:
        super().__init__(message, kind=kind, **context)
        self.kind = kind
        self.output = output


class NotReplayable(FarmError):
    """The job holds no action record to replay (not an agent task, or RUN predates the record)."""


class ReverifyRefused(FarmError):
    """The batch holds rollouts whose grader cannot score them again (see ``TaskHandler.reverify_safe``)."""

    def __init__(self, message: str, *, unsafe: dict[str, int]) -> None:
        super().__init__(message)
        self.unsafe = unsafe


class SampleFailed(FarmError):
    """The job ended without a reward (an infrastructure failure or a cancel): it must not be trained
    on as a reward of 0. The message says how it ended."""


class Unauthorized(FarmError):
    """The API refused the bearer token (farm.client only: the server answers 401)."""


class Unavailable(FarmError):
    """The API could not reach its database or Redis (farm.client only: the server answers 503)."""


class Cancelled(Exception):
    """The job was cancelled while its model call was in flight (the call was closed). Control flow,
    not a failure: not a ``FarmError``, so no stage is retried for it."""


class ApiError(FarmError):
    """The farm API answered with an error; raised by ``farm.client`` as the subclass that is
    also the error class of its ``code`` (see ``api_error``), so ``except NotFound`` works on both
    sides of the wire."""

    def __init__(
        self, status: int, code: str, detail: str, field: str | None = None, errors: list[Problem] | None = None
    ) -> None:
        super().__init__(f"{status} {code}: {detail}")
        self.status = status
        self.code = code
        self.detail = detail
        self.field = field
        #: every problem the answer listed (``{field, detail}``), when it listed them.
        self.errors = errors


#: The API's answer to each error: (class, HTTP status, ``code`` in the body), most specific
#: first. The server picks the first class an error is an instance of; the client maps the code
#: back to the class.
HTTP_ERRORS: list[tuple[type[FarmError], int, str]] = [
    (HandlerNotFound, 422, "unknown_task_type"),
    (NotFound, 404, "not_found"),
    (InvalidSpec, 422, "invalid_spec"),
    (Conflict, 409, "conflict"),
    (InvalidTransition, 409, "invalid_transition"),
    (UpstreamError, 502, "upstream_error"),
    (ConfigError, 500, "config_error"),
]
#: codes the API answers without a FarmError behind them (request validation, auth, size, 503).
_HTTP_ONLY_CODES: dict[str, type[FarmError]] = {
    "invalid_request": InvalidSpec,
    "body_too_large": InvalidSpec,
    "unauthorized": Unauthorized,
    "unavailable": Unavailable,
    # What the API answers when it loses its database or Redis mid-request: retry shortly.
    "database_unavailable": Unavailable,
    "redis_unavailable": Unavailable,
}
_CLASS_FOR_CODE: dict[str, type[FarmError]] = {code: cls for cls, _, code in HTTP_ERRORS} | _HTTP_ONLY_CODES
_STATUS_FOR_CODE: dict[str, int] = {code: status for _, status, code in HTTP_ERRORS}


def _api_bases(code: str, cls: type[FarmError]) -> tuple[type[FarmError], ...]:
    # Every 422 is bad input a trainer fixes, caught as InvalidSpec: an unknown task type is a
    # HandlerNotFound (a NotFound server-side) answered 422, and ``except InvalidSpec`` around a
    # submit must not let it through.
    if _STATUS_FOR_CODE.get(code) == 422 and not issubclass(cls, InvalidSpec):
        return (ApiError, cls, InvalidSpec)
    return (ApiError, cls)


_API_CLASSES: dict[str, type[ApiError]] = {
    code: type(f"Api{cls.__name__}", _api_bases(code, cls), {"__doc__": f"{cls.__doc__} (answered by the API)"})
    for code, cls in _CLASS_FOR_CODE.items()
}


def api_error(
    status: int, code: str, detail: str, field: str | None = None, errors: list[Problem] | None = None
) -> ApiError:
    """The exception for an error answer: an ``ApiError`` that is also the class of ``code``
    (a plain ``ApiError`` for a code this client does not know)."""
    return _API_CLASSES.get(code, ApiError)(status, code, detail, field, errors)


class ProxyError(Exception):
    """A failure as the proxy answers a harness: its HTTP status, message, field and code. Not a
    ``FarmError``: it is an answer already, which each wire format writes in its own error shape."""

    def __init__(self, status: int, message: str, *, param: str | None = None, code: str | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.param = param
        self.code = code


class TemplateFork(Exception):
    """The template cannot extend this history append-only; the message says how."""


class TemplateRefused(Exception):
    """The chat template refuses to render the conversation (it raised: Llama 3.1's takes one tool
    call per reply); the message is the template's."""


class NoCallOpening(Exception):
    """The template does not write a tool call as a ``<tool_call>`` block after this history."""
