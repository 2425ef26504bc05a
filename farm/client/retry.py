"""When the trainer's client sends a request again, and how long it waits first.

A request that never reached the server (connection refused, connect timeout) is always sent again.
One that may have reached it is sent again only when sending it twice does what sending it once does
(a GET, a cancel, a trial's end, a submit with an idempotency key: ``FarmClient.submit`` makes one
when the caller gives none), and only when what happened says "retry": an answer of 503 with a retryable code (the
API could not reach its database or Redis), a 502 or 504 from a gateway in front of it, or the
connection breaking or timing out before the answer was read. The weight-update calls (POSTs without
a key) are retried only when they never reached the server; any other failure raises at once.

Creating a trial is such a call too, with or without an id of the caller's: its answer holds the
trial's key, shown once, so a second create after a lost answer could not give it back (without an
id it makes a second trial; with one it answers 409). Deleting one is retried only when it never
reached the server (sent twice, the second answers 404).

Waits grow exponentially from ``base_s`` up to ``max_s`` with full jitter (so many trainers that lost
the API together do not come back together), and the retries of one call stop after ``total_s``:
then the last answer's error (or httpx's exception) is raised as it would have been without retries.
"""

from __future__ import annotations

import random
import time
from collections.abc import Callable
from dataclasses import dataclass

import httpx

from farm.errors import ApiError

#: 503 codes of the API that mean "try again shortly" (``farm.api.errors``).
RETRYABLE_CODES = frozenset({"database_unavailable", "redis_unavailable", "unavailable"})
#: statuses a proxy or load balancer in front of the API answers while it restarts.
GATEWAY_STATUSES = frozenset({502, 504})
#: failures before the request left this machine: always safe to send again.
NOT_SENT = (httpx.ConnectError, httpx.ConnectTimeout, httpx.PoolTimeout)
#: failures after the request may have reached the server: safe to send again only if idempotent.
MAYBE_SENT = (httpx.ReadError, httpx.WriteError, httpx.RemoteProtocolError, httpx.ReadTimeout, httpx.WriteTimeout)


@dataclass(frozen=True)
class RetryPolicy:
    """How a client retries (see the module docstring). ``total_s`` 0: never."""

    total_s: float = 120.0
    base_s: float = 0.25
    max_s: float = 8.0

    def delays(self, rng: random.Random | None = None) -> Callable[[], float]:
        """The waits of one call, one per retry: full jitter over an exponential ceiling."""
        draw = (rng or random).uniform
        ceiling = [self.base_s]

        def next_delay() -> float:
            delay = draw(0.0, ceiling[0])
            ceiling[0] = min(2 * ceiling[0], self.max_s)
            return delay

        return next_delay


#: the clients' default: a database or API restart of up to two minutes costs a trainer time, not its loop.
DEFAULT_RETRY = RetryPolicy()
NO_RETRIES = RetryPolicy(total_s=0.0)


def idempotent(request: httpx.Request) -> bool:
    """Whether sending ``request`` twice does what sending it once does."""
    if request.method in {"GET", "HEAD", "OPTIONS"}:
        return True
    if request.method == "POST" and request.url.path.endswith("/cancel"):
        return True
    if request.method == "POST" and request.url.path.startswith("/v1/trials/") and request.url.path.endswith("/end"):
        # Ending an ended trial answers the trial as it is (farm.trials.store.end).
        return True
    return request.method == "POST" and "Idempotency-Key" in request.headers


def retryable(exc: Exception, request: httpx.Request) -> bool:
    """Whether a call whose ``request`` raised ``exc`` (httpx's failure, or the ``ApiError`` of its
    answer) may be sent again."""
    if isinstance(exc, NOT_SENT):
        return True
    if isinstance(exc, MAYBE_SENT):
        return idempotent(request)
    if isinstance(exc, ApiError):
        says_retry = (exc.status == 503 and exc.code in RETRYABLE_CODES) or (
            # a gateway's answer while the API restarts (the API's own 502s carry a code of theirs)
            exc.status in GATEWAY_STATUSES and exc.code == "http_error"
        )
        return says_retry and idempotent(request)
    return False


class Attempts:
    """One call's retries under ``policy``: ``again`` says whether to try once more, and waits first."""

    def __init__(self, policy: RetryPolicy, *, clock: Callable[[], float] = time.monotonic) -> None:
        self._clock = clock
        self._deadline = clock() + policy.total_s
        self._next_delay = policy.delays()

    def wait_s(self) -> float | None:
        """The wait before the next try, or None when the call's time is spent."""
        delay = self._next_delay()
        return delay if self._clock() + delay <= self._deadline else None
