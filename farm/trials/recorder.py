"""How the proxy records a call: one interface (``CallRecorder``), two ways to run it.

Why two. A proxy call runs three statements of its own (find its parent, record its start, record
its finish), and on a machine where the proxy's CPU is the backend's loss each costs: run from the
event loop through psycopg's async pools (``LoopRecorder``, PostgreSQL only), they save a thread
hop, SQLAlchemy's execution layer and a checkout's bookkeeping per statement, ~1 ms of CPU per call
(measured with ``bench/proxy.py``). Everything else runs SQLAlchemy's statements on a worker thread
(``ThreadRecorder``): SQLite; an event loop other than the one the pools were opened on (a test's
client may run several); and what is rare and holds the logic (a new segment to explain, a branch's
finish, a closed trial's error, a failure). ``LoopRecorder`` hands those to a ``ThreadRecorder``.

Two engines serve the threads. ``early`` commits without waiting for the disk: reads and a call's
pending row, which a database crash may lose; the call's own finish then finds no pending row and
fails the call (the harness gets an error, never an answer the record lacks). ``durable`` waits
for the disk: every finish, carrying the earlier writes with it (the WAL is written in order).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Sequence
from concurrent.futures import Executor
from contextlib import AbstractContextManager
from dataclasses import replace
from typing import Any, Protocol, TypeVar

from sqlalchemy import Connection, Engine

from farm.trials import statements
from farm.trials.async_statements import AsyncTrials
from farm.trials.values import CallFinish, CallStart, LatestCall, Parent

T = TypeVar("T")
log = logging.getLogger(__name__)
#: a call that starts a segment for no reason found yet: its certificate entry, given the trial's
#: latest finished call (None: the trial has none).
Explain = Callable[[LatestCall | None], dict[str, Any]]


class CallRecorder(Protocol):
    """Where a proxy call's record goes; every write commits before it returns."""

    def reading(self) -> AbstractContextManager[Connection]:
        """A connection for reads on the calling thread (a worker thread: it blocks)."""
        ...

    async def find_parent(self, trial_id: str, message_hashes: Sequence[bytes]) -> Parent | None:
        """``statements.find_parent``."""
        ...

    async def start(self, trial_id: str, start: CallStart, *, explain: Explain | None = None) -> int:
        """Record the call as pending; its seq. ``explain``: see ``Explain``.

        Raises:
            TrialNotFound, TrialEnded: the trial is not open.
        """
        ...

    async def finish(self, trial_id: str, seq: int, build: Callable[[], CallFinish], *, parent_seq: int | None) -> bool:
        """Record the call's answer, durably; False when it was no longer pending. ``build`` makes
        the values where the statement runs (on a thread, hashing and decoding stay off the loop)."""
        ...

    async def fail(self, trial_id: str, seq: int, error: str, *, seen: bool) -> None:
        """Record the call as failed (``statements.fail_call``); a failure to do so is logged."""
        ...

    async def close(self) -> None: ...


class ThreadRecorder:
    """SQLAlchemy's statements on ``executor``'s threads. Owns ``early`` (``close`` disposes of it)
    unless it is ``durable`` itself (SQLite)."""

    def __init__(self, *, durable: Engine, early: Engine | None, executor: Executor) -> None:
        self.durable = durable
        self._owned = early
        self.early = early or durable
        self._executor = executor

    async def _in_thread(self, fn: Callable[..., T], *args: Any) -> T:
        return await asyncio.get_running_loop().run_in_executor(self._executor, fn, *args)

    def reading(self) -> AbstractContextManager[Connection]:
        return self.early.connect()

    async def find_parent(self, trial_id: str, message_hashes: Sequence[bytes]) -> Parent | None:
        def find() -> Parent | None:
            with self.early.connect() as conn:
                return statements.find_parent(conn, trial_id, message_hashes)

        return await self._in_thread(find)

    async def start(self, trial_id: str, start: CallStart, *, explain: Explain | None = None) -> int:
        def add() -> int:
            call = start
            with self.early.connect() as conn:
                if explain is not None:
                    call = replace(start, continuity=explain(statements.latest_call(conn, trial_id)))
                seq = statements.add_call(conn, trial_id, call)
                conn.commit()
            return seq

        return await self._in_thread(add)

    async def raise_closed(self, trial_id: str) -> None:
        """Raises TrialNotFound or TrialEnded: why a call of the trial could not start."""

        def check() -> None:
            with self.early.connect() as conn:
                statements.raise_closed(conn, trial_id)

        await self._in_thread(check)

    async def finish(self, trial_id: str, seq: int, build: Callable[[], CallFinish], *, parent_seq: int | None) -> bool:
        def finish() -> bool:
            values = build()
            with self.durable.begin() as conn:
                return statements.finish_call(conn, trial_id, seq, values, parent_seq=parent_seq)

        return await self._in_thread(finish)

    async def fail(self, trial_id: str, seq: int, error: str, *, seen: bool) -> None:
        def fail() -> None:
            try:
                with self.durable.begin() as conn:
                    statements.fail_call(conn, trial_id, seq, error, seen=seen)
            except Exception:  # the database is what failed: the pending row says the outcome is unknown
                log.exception("could not record the failure of call %s of trial %s", seq, trial_id)

        await self._in_thread(fail)

    async def close(self) -> None:
        if self._owned is not None:
            self._owned.dispose()


class LoopRecorder:
    """A call's usual statements from the event loop (``AsyncTrials``, owned); the rest through
    ``threads``. The statements are the same: ``farm.trials.async_statements`` compiles them."""

    def __init__(self, pools: AsyncTrials, threads: ThreadRecorder) -> None:
        self._pools = pools
        self.threads = threads

    def reading(self) -> AbstractContextManager[Connection]:
        return self.threads.reading()

    async def find_parent(self, trial_id: str, message_hashes: Sequence[bytes]) -> Parent | None:
        db = await self._pools.here()
        if db is None:
            return await self.threads.find_parent(trial_id, message_hashes)
        return await db.find_parent(trial_id, message_hashes)

    async def start(self, trial_id: str, start: CallStart, *, explain: Explain | None = None) -> int:
        db = await self._pools.here()
        if db is None or explain is not None:
            return await self.threads.start(trial_id, start, explain=explain)
        seq = await db.add_call(trial_id, start)
        if seq is None:
            await self.threads.raise_closed(trial_id)
            raise AssertionError("unreachable: the trial was not open")
        return seq

    async def finish(self, trial_id: str, seq: int, build: Callable[[], CallFinish], *, parent_seq: int | None) -> bool:
        db = await self._pools.here()
        if db is None:
            return await self.threads.finish(trial_id, seq, build, parent_seq=parent_seq)
        values = build()
        if await db.finish_call(trial_id, seq, values):
            return True
        # A branch, or no longer pending: the sync finish tells which.
        return await self.threads.finish(trial_id, seq, lambda: values, parent_seq=parent_seq)

    async def fail(self, trial_id: str, seq: int, error: str, *, seen: bool) -> None:
        await self.threads.fail(trial_id, seq, error, seen=seen)

    async def close(self) -> None:
        await self._pools.close()
        await self.threads.close()


def make_recorder(
    *,
    durable: Engine,
    early: Engine | None,
    executor: Executor,
    url: str,
    pool_size: int,
    prepared_statements: bool = True,
    startup_options: bool = True,
) -> CallRecorder:
    """A ``LoopRecorder`` on PostgreSQL, else a ``ThreadRecorder``. ``pool_size``: each async
    pool's bound (as many connections as the engines may open); ``prepared_statements`` and
    ``startup_options``: ``database.*`` of the same names."""
    threads = ThreadRecorder(durable=durable, early=early, executor=executor)
    if url.startswith("postgresql"):
        trials = AsyncTrials(
            url, max_size=pool_size, prepared_statements=prepared_statements, startup_options=startup_options
        )
        return LoopRecorder(trials, threads)
    return threads
