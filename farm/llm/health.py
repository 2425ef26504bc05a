"""Periodic health check of the balancer's backends: eject the dead, re-admit those that answer again.

Any process that holds a ``Balancer`` may run it (an API process, a worker, ``farm llm``); several
checkers at once are harmless because each probe result is applied by one atomic script.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import httpx

from farm.config import LLMSettings
from farm.errors import FarmError
from farm.llm.balancer import Backend, Balancer
from farm.periodic import Periodic

#: time between two rounds of probes.
DEFAULT_HEALTH_INTERVAL_S = 5.0
#: a backend that takes longer than this to answer GET /health counts as down for that probe.
DEFAULT_PROBE_TIMEOUT_S = 2.0
MAX_PARALLEL_PROBES = 16

log = logging.getLogger(__name__)


class HealthChecker:
    """Probes every registered backend's ``GET /health`` and feeds the results to the balancer."""

    def __init__(
        self,
        balancer: Balancer,
        *,
        interval_s: float = DEFAULT_HEALTH_INTERVAL_S,
        probe_timeout_s: float = DEFAULT_PROBE_TIMEOUT_S,
        transport: httpx.BaseTransport | None = None,
        registered: Callable[[], list[dict[str, Any]]] | None = None,
    ) -> None:
        self.balancer = balancer
        #: the durable registry (``farm.db.backends.registered``): backends Redis lost are put back.
        self._registered = registered
        self._http = httpx.Client(timeout=probe_timeout_s, transport=transport)
        self._rounds = Periodic(
            self.run_once,
            interval_s=interval_s,
            name="farm-llm-health",
            what="LLM backend health check",
            log=log,
            at_start=True,
        )
        # (id, url) of backends whose URL cannot be requested at all: logged once, not every round.
        self._unusable: set[tuple[str, str]] = set()

    @classmethod
    def from_settings(
        cls,
        balancer: Balancer,
        settings: LLMSettings,
        *,
        registered: Callable[[], list[dict[str, Any]]] | None = None,
    ) -> HealthChecker:
        return cls(
            balancer,
            interval_s=settings.health_interval_s,
            probe_timeout_s=settings.probe_timeout_s,
            registered=registered,
        )

    def restore(self) -> int:
        """Put back the registered backends Redis no longer has (it restarted empty); returns how
        many. They come back healthy with no load; the probes that follow correct the health."""
        if self._registered is None:
            return 0
        present = {backend.id for backend in self.balancer.backends()}
        missing = [fields for fields in self._registered() if fields["backend_id"] not in present]
        restored = 0
        for fields in missing:
            try:
                self.balancer.add_backend(**fields)
            except FarmError as exc:  # one bad record must not keep the others out
                log.error("LLM backend %s cannot be registered again: %s", fields["backend_id"], exc)
                continue
            log.warning("LLM backend %s was missing from Redis: registered again", fields["backend_id"])
            restored += 1
        return restored

    def probe(self, backend: Backend) -> bool:
        """Whether the backend answers ``GET /health`` with 200. Never raises: a backend that cannot
        be reached, or whose stored URL cannot even be parsed, is down for this probe."""
        try:
            return self._http.get(f"{backend.url}/health").status_code == 200
        except httpx.HTTPError:
            return False
        except Exception as exc:  # e.g. httpx.InvalidURL, which is no HTTPError
            if (backend.id, backend.url) not in self._unusable:
                self._unusable.add((backend.id, backend.url))
                log.warning("LLM backend %s: cannot probe %r (%s): counted as down", backend.id, backend.url, exc)
            return False

    def run_once(self) -> dict[str, bool]:
        """Probe every backend once (in parallel). Returns each backend's health afterwards."""
        self.restore()
        backends = self.balancer.backends()
        if not backends:
            return {}
        with ThreadPoolExecutor(max_workers=min(MAX_PARALLEL_PROBES, len(backends))) as pool:
            results = list(pool.map(self.probe, backends))
        health: dict[str, bool] = {}
        for backend, ok in zip(backends, results, strict=True):
            after = self.balancer.record_probe(backend.id, ok)
            if after is None:
                continue  # removed while we probed
            if after != backend.healthy:
                log.warning("LLM backend %s (%s) is now %s", backend.id, backend.url, "up" if after else "down")
            health[backend.id] = after
        return health

    def start(self) -> None:
        """Probe every ``interval_s`` on a daemon thread until ``stop``."""
        self._rounds.start()

    def stop(self) -> None:
        self._rounds.stop()
        self._http.close()
