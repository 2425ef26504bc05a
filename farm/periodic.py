"""``Periodic``: one function called every interval on a daemon thread, until stopped."""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable


class Periodic:
    """Calls ``tick`` every ``interval_s`` on a daemon thread named ``name`` (first at once with
    ``at_start``) until ``stop``. A failing tick is logged on ``log`` as "<what> failed" and the
    next one runs on time: a database or Redis hiccup must not end the thread."""

    def __init__(
        self,
        tick: Callable[[], object],
        *,
        interval_s: float,
        name: str,
        what: str,
        log: logging.Logger,
        at_start: bool = False,
    ) -> None:
        self.tick = tick
        self.interval_s = interval_s
        self.name = name
        self._what = what
        self._log = log
        self._at_start = at_start
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        self._stop.clear()
        self._thread = threading.Thread(target=self._loop, name=self.name, daemon=True)
        self._thread.start()

    def stop(self) -> None:
        """Stop, waiting for a tick in progress to end."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join()

    def _loop(self) -> None:
        if self._at_start:
            self._run()
        while not self._stop.wait(self.interval_s):
            self._run()

    def _run(self) -> None:
        try:
            self.tick()
        except Exception:
            self._log.exception("%s failed", self._what)
