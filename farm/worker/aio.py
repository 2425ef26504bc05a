"""One asyncio event loop per worker process, on its own thread.

Async handler methods run here rather than in a fresh ``asyncio.run`` per stage, so what
lives on a loop (pooled keep-alive connections to the LLM backends) is shared by every stage
of the process. Coroutines must not block: blocking work goes through ``asyncio.to_thread``.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Coroutine
from concurrent.futures import ThreadPoolExecutor
from typing import Any, TypeVar

T = TypeVar("T")


class LoopThread:
    def __init__(self, *, max_threads: int = 64) -> None:
        self._loop: asyncio.AbstractEventLoop | None = None
        self._lock = threading.Lock()
        self._max_threads = max_threads

    @property
    def loop(self) -> asyncio.AbstractEventLoop:
        with self._lock:
            if self._loop is None:
                loop = asyncio.new_event_loop()
                # to_thread's default pool has cpu+4 threads: on a small node that queues every
                # episode's blocking calls (tools, balancer) behind a handful of others.
                loop.set_default_executor(ThreadPoolExecutor(self._max_threads, thread_name_prefix="farm-aio"))
                threading.Thread(target=_serve, args=(loop,), name="farm-asyncio", daemon=True).start()
                self._loop = loop
            return self._loop

    def run(self, coro: Coroutine[Any, Any, T], *, timeout_s: float | None = None) -> T:
        """Run ``coro`` on the loop and wait for it from this (non-loop) thread.

        Raises:
            TimeoutError: it did not finish in ``timeout_s``; it is cancelled.
        """
        future = asyncio.run_coroutine_threadsafe(coro, self.loop)
        try:
            return future.result(timeout=timeout_s)
        except TimeoutError:
            future.cancel()
            raise

    def close(self) -> None:
        with self._lock:
            if self._loop is not None:
                self._loop.call_soon_threadsafe(self._loop.stop)
                self._loop = None


def _serve(loop: asyncio.AbstractEventLoop) -> None:
    """The loop thread: run until ``LoopThread.close`` stops the loop, then close it (its self-pipe, its executor)."""
    loop.run_forever()
    loop.close()
