"""A proxy call's three statements of ``farm.trials.statements`` run from the event loop (PostgreSQL only).

``find_parent``, ``add_call`` and the usual ``finish_call`` are the same SQLAlchemy statements,
compiled once to SQL and run through psycopg's async driver as server-side prepared statements.
That leaves out a thread hop per statement, SQLAlchemy's execution layer and a connection
checkout's bookkeeping: ~1 ms of CPU less per call, measured with ``bench/proxy.py``, on a machine
where the proxy's CPU is the backend's loss. What is rare (a branch's finish, a closed trial's
error) goes back to the sync functions, which hold the logic.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from psycopg import AsyncConnection
from psycopg.errors import UniqueViolation
from psycopg.rows import namedtuple_row
from psycopg.types.json import Json
from psycopg_pool import AsyncConnectionPool
from sqlalchemy import JSON
from sqlalchemy.dialects.postgresql.psycopg import PGDialect_psycopg
from sqlalchemy.sql import ClauseElement
from sqlalchemy.sql.compiler import SQLCompiler

from farm.db.session import libpq_url
from farm.trials import statements
from farm.trials.values import CallFinish, CallStart, Parent

_DIALECT = PGDialect_psycopg()  # type: ignore[no-untyped-call]


@dataclass(frozen=True)
class _Compiled:
    """A statement's SQL (psycopg's ``%(name)s`` parameters), the values SQLAlchemy binds itself
    (literals in the statement), and which parameters are JSON."""

    sql: str
    defaults: dict[str, Any]
    json: frozenset[str]

    @classmethod
    def of(cls, statement: ClauseElement, column_keys: Sequence[str] | None = None) -> _Compiled:
        compiled = statement.compile(dialect=_DIALECT, column_keys=list(column_keys) if column_keys else None)
        assert isinstance(compiled, SQLCompiler)
        names = compiled.bind_names
        defaults = {name: bind.value for bind, name in names.items() if not bind.required and bind.value is not None}
        json = frozenset(name for bind, name in names.items() if isinstance(bind.type, JSON))
        return cls(str(compiled), defaults, json)

    def params(self, values: dict[str, Any]) -> dict[str, Any]:
        out = {**self.defaults, **values}
        for name in self.json & out.keys():
            if out[name] is not None:
                out[name] = Json(out[name])
        return out


_PARENT = _Compiled.of(statements.PARENT_ANY)
_ADD_CALL = _Compiled.of(statements.ADD_CALL)
_FINISH = _Compiled.of(statements.FINISH, ["_trial_id", "_seq", *statements.FINISHED_COLUMNS])
_FINISH_CONTINUITY = _Compiled.of(statements.FINISH, ["_trial_id", "_seq", *statements.FINISHED_COLUMNS, "continuity"])


class AsyncTrials:
    """Two pools: ``early`` commits without waiting for the disk (a call's pending row, which a
    database crash may lose: see ``farm.trials.recorder``), ``durable`` waits (a finish)."""

    def __init__(
        self,
        url: str,
        *,
        max_size: int,
        timeout_s: float = 10.0,
        prepared_statements: bool = True,
        startup_options: bool = True,
    ) -> None:
        """``prepared_statements`` and ``startup_options``: ``database.*`` of the same names (both off
        behind PgBouncer in transaction mode)."""
        dsn = libpq_url(url)
        #: the loop the pools were opened on: they serve no other (a test's client may run several).
        self.loop: asyncio.AbstractEventLoop | None = None
        self._opened: asyncio.Task[None]
        common: dict[str, Any] = {"autocommit": True, "row_factory": namedtuple_row}
        if not prepared_statements:
            # psycopg then prepares nothing, not even an ``execute(..., prepare=True)``.
            common["prepare_threshold"] = None
        early = {**common, "options": "-c synchronous_commit=off"} if startup_options else common
        self.early: AsyncConnectionPool[AsyncConnection[Any]] = AsyncConnectionPool(
            dsn,
            min_size=1,
            max_size=max_size,
            kwargs=early,
            open=False,
            timeout=timeout_s,
            name="proxy-early",
        )
        self.durable: AsyncConnectionPool[AsyncConnection[Any]] = AsyncConnectionPool(
            dsn, min_size=1, max_size=max_size, kwargs=common, open=False, timeout=timeout_s, name="proxy-durable"
        )

    async def here(self) -> AsyncTrials | None:
        """These pools, opened on the running loop the first time; None on any other loop."""
        loop = asyncio.get_running_loop()
        if self.loop is None:
            self.loop = loop
            self._opened = loop.create_task(self._open())
        if self.loop is not loop:
            return None
        if not self._opened.done():  # every caller waits for the one opening
            await asyncio.shield(self._opened)
        self._opened.result()
        return self

    async def _open(self) -> None:
        await self.early.open()
        await self.durable.open()

    async def close(self) -> None:
        if self.loop is asyncio.get_running_loop():
            await self.early.close()
            await self.durable.close()

    async def find_parent(self, trial_id: str, message_hashes: Sequence[bytes]) -> Parent | None:
        """``statements.find_parent``."""
        if len(message_hashes) < 2:
            return None
        async with self.early.connection() as conn:
            params = _PARENT.params({"trial_id": trial_id, "hashes": list(message_hashes[:-1])})
            row = await (await conn.execute(_PARENT.sql, params, prepare=True)).fetchone()
        return statements.parent_of(row, len(message_hashes[0])) if row is not None else None

    async def add_call(self, trial_id: str, start: CallStart) -> int | None:
        """``statements.add_call``, committed at once (without waiting for the disk); None when the
        trial is not open (``statements.raise_closed`` says why)."""
        params = _ADD_CALL.params(statements.pending_params(trial_id, start))
        async with self.early.connection() as conn:
            row = await (await conn.execute(_ADD_CALL.sql, params, prepare=True)).fetchone()
        return int(row.seq) if row is not None else None

    async def finish_call(self, trial_id: str, seq: int, finish: CallFinish) -> bool:
        """``statements.finish_call``'s usual case, committed durably: False when the call is not
        pending or a sibling finished first (``statements.finish_call`` then does the rest).

        One statement, its own transaction, without the trial's lock: a sibling finishing at the
        same moment is caught by ``uq_trial_calls_done_child`` (the one to commit second fails).
        """
        values = statements.finished_params(finish)
        statement = _FINISH_CONTINUITY if "continuity" in values else _FINISH
        params = statement.params({"_trial_id": trial_id, "_seq": seq, **values})
        async with self.durable.connection() as conn:
            try:
                row = await (await conn.execute(statement.sql, params, prepare=True)).fetchone()
            except UniqueViolation:
                return False
        return row is not None
