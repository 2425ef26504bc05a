"""Periodic health check of the balancer's backends: eject the dead, re-admit those that answer again.

Any process that holds a ``Balancer`` may run it (an API process, a worker, ``farm llm``); several
checkers at once are harmless because each probe result is applied by one atomic script.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import httpx

from farm.config import LLMSettings
from farm.llm.balancer import Backend, Balancer

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
        self.interval_s = interval_s
        self._http = httpx.Client(timeout=probe_timeout_s, transport=transport)
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

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
        for fields in missing:
            self.balancer.add_backend(**fields)
            log.warning("LLM backend %s was missing from Redis: registered again", fields["backend_id"])
        return len(missing)

    def probe(self, backend: Backend) -> bool:
        try:
            return self._http.get(f"{backend.url}/health").status_code == 200
        except httpx.HTTPError:
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
        self._stop.clear()
        self._thread = threading.Thread(target=self._loop, name="farm-llm-health", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
        self._http.close()

    def _loop(self) -> None:
        while not self._stop.is_set():
            try:
                self.run_once()
            except Exception:  # a Redis hiccup must not end the checker
                log.exception("LLM backend health check failed")
            self._stop.wait(self.interval_s)
