"""Redis min-heap balancer over LLM backends, sticky per job.

A sorted set orders the healthy backends by ``inflight / capacity``. ``acquire(job)`` gives a new
job the least-loaded backend (ties: the least recently chosen) and every later call for that job
the same backend, refreshing the job's lease; ``release(job)`` gives the slot back. A job whose
lease runs out (worker killed, job abandoned) is reaped by the next balancer call, so load cannot
leak. Each operation is one Lua script (``farm.llm.lua``): atomic across any number of processes.

A dead or removed backend's jobs move on their next ``acquire``; the ``Lease`` says where from
(``moved_from``) so the caller can record it, and the move is also kept in a capped Redis list.
Adding or removing a backend never touches other backends' sticky jobs.

The HTTP routes ``/v1/backends`` are a thin layer over ``add_backend``/``remove_backend``/``backends``.
"""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass
from typing import Any

import httpx
from redis import Redis
from redis.exceptions import NoScriptError

from farm import constants
from farm.config import LLMSettings
from farm.errors import InvalidSpec, NoBackendAvailable
from farm.llm import lua
from farm.llm.types import BackendKind

#: a job's backend is held this long after its last acquire; refreshed on every turn.
DEFAULT_LEASE_TTL_S = 900.0
#: consecutive failed health probes before a backend is ejected.
DEFAULT_FAILURES_TO_EJECT = 2
#: expired leases reclaimed per balancer call (bounds the latency of one call).
REAP_LIMIT = 100
MAX_MOVES_KEPT = 1000
MAX_TIES_SCANNED = 256

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Backend:
    """One LLM backend as the balancer sees it."""

    id: str
    url: str
    kind: BackendKind
    model: str | None
    capacity: int
    inflight: int = 0
    healthy: bool = True


@dataclass(frozen=True)
class Lease:
    """A job's hold on a backend. ``moved_from`` names the dead/removed backend the job just left."""

    job_id: str
    backend_id: str
    url: str
    kind: BackendKind
    model: str | None
    moved_from: str | None = None


def _s(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def _check_url(url: str) -> None:
    try:
        parsed = httpx.URL(url)
    except httpx.InvalidURL as exc:
        raise InvalidSpec(f"url: {url!r} is not a URL an HTTP request can be sent to: {exc}", field="url") from exc
    if parsed.scheme not in ("http", "https") or not parsed.host:
        raise InvalidSpec(f"url: {url!r} must be http(s)://host[:port][/path]", field="url")


class Balancer:
    """Sticky least-loaded routing of jobs to backends, shared by every process through Redis."""

    def __init__(
        self,
        redis: Redis,
        *,
        lease_ttl_s: float = DEFAULT_LEASE_TTL_S,
        failures_to_eject: int = DEFAULT_FAILURES_TO_EJECT,
    ) -> None:
        self.redis = redis
        self.lease_ttl_ms = int(lease_ttl_s * 1000)
        self.failures_to_eject = failures_to_eject
        self._keys = [
            constants.llm_heap_key(),
            constants.llm_jobs_key(),
            constants.llm_leases_key(),
            constants.llm_choice_seq_key(),
            constants.llm_moves_key(),
            constants.llm_backends_key(),
            constants.llm_last_chosen_key(),
        ]
        self._prefix = constants.llm_backend_key("")
        # What every script call sends first, encoded once: the keys, the backend prefix, the reap limit.
        self._acquire_args = [str(n).encode() for n in (self.lease_ttl_ms, MAX_MOVES_KEPT, MAX_TIES_SCANNED)]
        self._fixed = [*(k.encode() for k in self._keys), self._prefix.encode(), str(REAP_LIMIT).encode()]
        self._acquire = redis.register_script(lua.ACQUIRE)
        self._release = redis.register_script(lua.RELEASE)
        self._reap = redis.register_script(lua.REAP)
        self._add = redis.register_script(lua.ADD_BACKEND)
        self._remove = redis.register_script(lua.REMOVE_BACKEND)
        self._probe = redis.register_script(lua.PROBE)

    @classmethod
    def from_settings(cls, redis: Redis, settings: LLMSettings) -> Balancer:
        return cls(redis, lease_ttl_s=settings.lease_ttl_s, failures_to_eject=settings.failures_to_eject)

    def _run(self, script: Any, *args: Any) -> Any:
        try:
            return self.redis.evalsha(script.sha, len(self._keys), *self._fixed, *args)
        except NoScriptError:  # a Redis that restarted empty, or never saw the script: load it and retry
            return script(keys=self._keys, args=[self._prefix, REAP_LIMIT, *args])

    # ---- backends ------------------------------------------------------------------------------
    def add_backend(
        self,
        *,
        backend_id: str,
        url: str,
        kind: BackendKind | str = BackendKind.VLLM,
        model: str | None = None,
        capacity: int = 1,
    ) -> Backend:
        """Register a backend (or update its url/kind/model/capacity, keeping its load and health).

        Raises:
            ValueError: capacity below 1.
            InvalidSpec: a URL no HTTP request can be sent to (``field`` is ``url``).
        """
        if capacity < 1:
            raise ValueError(f"capacity must be >= 1, got {capacity}")
        _check_url(url)
        kind = BackendKind(kind)
        self._run(self._add, backend_id, url.rstrip("/"), kind.value, model or "", capacity)
        backend = self.get_backend(backend_id)
        assert backend is not None  # just written by the script
        return backend

    def remove_backend(self, backend_id: str) -> bool:
        """Forget a backend; its jobs move on their next acquire. False if it was not registered."""
        return bool(self._run(self._remove, backend_id))

    def get_backend(self, backend_id: str) -> Backend | None:
        """The backend, or None when it is not registered (or its Redis entry cannot be read)."""
        raw = self.redis.hgetall(constants.llm_backend_key(backend_id))
        if not raw:
            return None
        f = {_s(k): _s(v) for k, v in raw.items()}
        try:
            return Backend(
                id=backend_id,
                url=f["url"],
                kind=BackendKind(f["kind"]),
                model=f["model"] or None,
                capacity=int(f["capacity"]),
                inflight=int(f["inflight"]),
                healthy=f["healthy"] == "1",
            )
        except (KeyError, ValueError) as exc:
            # One damaged entry (written by hand, or by an older version) must not take down every
            # listing and health round; DELETE /v1/backends/{id} still removes it.
            log.warning("LLM backend %r has an unreadable Redis entry (%r): skipped", backend_id, exc)
            return None

    def backends(self) -> list[Backend]:
        ids = sorted(_s(b) for b in self.redis.smembers(constants.llm_backends_key()))
        return [b for b in (self.get_backend(i) for i in ids) if b is not None]

    def set_healthy(self, backend_id: str, healthy: bool) -> bool:
        """Eject (False) or re-admit (True) a backend now. Returns whether its state changed."""
        before, after = self._run(self._probe, backend_id, int(healthy), 1)
        return int(before) >= 0 and before != after

    def record_probe(self, backend_id: str, ok: bool) -> bool | None:
        """Count one health probe: re-admit on success, eject after ``failures_to_eject`` failures in a row.

        Returns:
            The backend's health after the probe, or None if it is not registered.
        """
        _, after = self._run(self._probe, backend_id, int(ok), self.failures_to_eject)
        return None if int(after) < 0 else bool(after)

    # ---- jobs ----------------------------------------------------------------------------------
    def acquire(self, job_id: str) -> Lease:
        """The job's backend: its sticky one while healthy, else the least loaded (the move is in the lease).

        Raises:
            NoBackendAvailable: no healthy backend is registered.
        """
        out = self._run(self._acquire, job_id, *self._acquire_args)
        if not out:
            raise NoBackendAvailable(
                "no healthy LLM backend: register one (POST /v1/backends) or wait for the health check",
                job_id=job_id,
            )
        backend_id, url, kind, model, moved_from = (_s(v) for v in out)
        return Lease(
            job_id=job_id,
            backend_id=backend_id,
            url=url,
            kind=BackendKind(kind),
            model=model or None,
            moved_from=moved_from or None,
        )

    def release(self, job_id: str) -> bool:
        """Give the job's slot back (call on success, failure and cancel alike). False if it held none."""
        return bool(self._run(self._release, job_id))

    def assignment(self, job_id: str) -> str | None:
        value = self.redis.hget(constants.llm_jobs_key(), job_id)
        return None if value is None else _s(value)

    def reap(self) -> int:
        """Reclaim the slots of jobs whose lease expired (every other call does this too)."""
        return int(self._run(self._reap))

    def moves(self, limit: int = 100) -> list[dict[str, Any]]:
        """The most recent re-routings, newest first: ``{job, from, to, at_ms}``."""
        return [json.loads(_s(m)) for m in self.redis.lrange(constants.llm_moves_key(), 0, limit - 1)]
