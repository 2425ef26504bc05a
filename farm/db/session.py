"""Engines and sessions. SQLite gets WAL, a busy timeout and BEGIN IMMEDIATE so several
worker processes can share one file without 'database is locked' upgrade deadlocks."""

from __future__ import annotations

import logging
import random
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, TypeVar

from sqlalchemy import Engine, create_engine, event, make_url
from sqlalchemy.exc import DBAPIError, InterfaceError, OperationalError
from sqlalchemy.exc import TimeoutError as PoolTimeout
from sqlalchemy.orm import Session, sessionmaker

from farm.config import Settings
from farm.schemas.stored import loads_stored

T = TypeVar("T")


def make_engine(
    settings: Settings,
    *,
    url: str | None = None,
    size: int | None = None,
    overflow: int | None = None,
    name: str | None = None,
) -> Engine:
    """The process's engine: ``size`` connections kept and ``overflow`` more for a burst (the API's
    ``database.pool_size`` and ``max_overflow`` unless given: ``farm.db.budget`` sizes the others).
    ``name`` is the connections' ``application_name`` (``pg_stat_activity`` shows who holds what)."""
    url = url or settings.database_url
    if url.startswith("sqlite"):
        return _sqlite_engine(url, settings)
    return _postgres_engine(url, settings, size=size, overflow=overflow, name=name)


def _postgres_engine(
    url: str,
    settings: Settings,
    *,
    size: int | None,
    overflow: int | None,
    name: str | None,
    options: str | None = None,
    **engine_options: Any,
) -> Engine:
    db = settings.database
    connect_args: dict[str, Any] = {}
    if db.startup_options:
        if name:
            connect_args["application_name"] = name[:63]
        if options:
            connect_args["options"] = options
    if not db.prepared_statements:
        connect_args["prepare_threshold"] = None
    return create_engine(
        url,
        echo=db.echo,
        pool_size=db.pool_size if size is None else size,
        max_overflow=db.max_overflow if overflow is None else overflow,
        pool_timeout=db.pool_timeout_s,
        # No pre-ping round trip per checkout: a dead connection fails its statement, the pool
        # drops every connection of that generation, and the stage (or the API client) retries.
        pool_pre_ping=db.pool_pre_ping,
        connect_args=connect_args,
        # A row stored before farm.schemas.stored's rules may hold a lone surrogate: served replaced.
        json_deserializer=loads_stored,
        **engine_options,
    )


def libpq_url(url: str) -> str:
    """A SQLAlchemy PostgreSQL URL (``postgresql+psycopg://...``) as libpq and psycopg take it."""
    return make_url(url).set(drivername="postgresql").render_as_string(hide_password=False)


def make_autocommit_engine(
    settings: Settings,
    *,
    url: str | None = None,
    durable: bool,
    size: int | None = None,
    overflow: int | None = None,
    name: str | None = None,
) -> Engine | None:
    """PostgreSQL: an engine whose statements commit one by one, for the one-statement claims
    and completions of ``farm.db.jobs.claims`` and ``farm.db.jobs.completions``; that saves the BEGIN and
    COMMIT round trips. Unless ``durable``, its commits do not wait for the WAL to reach the disk
    (``synchronous_commit`` off, ~2 ms less per statement; unless ``database.startup_options`` is
    off, as behind PgBouncer, which refuses the option that asks for it): for the writes a database crash may
    lose without harm (claims, INIT and RUN completions; see ``jobrows.commit_early``). A
    completion that finishes a job goes through a durable one. None on SQLite, where every
    write goes through a transaction. (A durable one that may share a pool: ``autocommit_of``.)"""
    url = url or settings.database_url
    if url.startswith("sqlite"):
        return None
    return _postgres_engine(
        url,
        settings,
        size=size,
        overflow=overflow,
        name=name,
        options=None if durable else "-c synchronous_commit=off",
        isolation_level="AUTOCOMMIT",
    )


def autocommit_of(engine: Engine) -> Engine | None:
    """``engine``'s pool, its statements committed one by one (durably): no connection of its own.
    (psycopg's autocommit is a flag of the client, so a checkout sets and resets it without a round trip.)
    None on SQLite."""
    if engine.dialect.name == "sqlite":
        return None
    return engine.execution_options(isolation_level="AUTOCOMMIT")


def unavailable(exc: BaseException) -> bool:
    """Whether ``exc`` says the database cannot serve now (no free connection in the pool, "too
    many clients", refused, restarting, the connection lost mid-statement), not that a statement
    is wrong: what is worth waiting out."""
    if isinstance(exc, PoolTimeout):
        return True
    if isinstance(exc, DBAPIError):
        return exc.connection_invalidated or isinstance(exc, (OperationalError, InterfaceError))
    return False


def waiting_out(
    call: Callable[[], T],
    *,
    settings: Settings,
    what: str,
    log: logging.Logger,
    sleep: Callable[[float], None] = time.sleep,
) -> T:
    """``call()``, tried again while the database is ``unavailable`` (backing off, with jitter, up to
    ``database.unavailable_backoff_s`` apart) for up to ``database.unavailable_wait_s``; then, or for
    any other error, what it raised. ``call`` must be safe to repeat."""
    db = settings.database
    deadline = time.monotonic() + db.unavailable_wait_s
    delay = min(0.1, db.unavailable_backoff_s)
    while True:
        try:
            return call()
        except Exception as exc:
            if not unavailable(exc) or time.monotonic() + delay > deadline:
                raise
            first = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
            log.warning("%s: the database is unavailable (%s); trying again in %.1fs", what, first, delay)
            sleep(delay * random.uniform(0.5, 1.0))
            delay = min(2 * delay, db.unavailable_backoff_s)


def _sqlite_engine(url: str, settings: Settings) -> Engine:
    path = url.split("///", 1)[-1]
    if path and path != ":memory:":
        Path(path).parent.mkdir(parents=True, exist_ok=True)
    engine = create_engine(
        url,
        echo=settings.database.echo,
        connect_args={"timeout": settings.database.sqlite_busy_timeout_s, "check_same_thread": False},
        json_deserializer=loads_stored,
    )

    @event.listens_for(engine, "connect")
    def _on_connect(dbapi_conn: Any, _record: Any) -> None:
        # Let SQLAlchemy, not pysqlite, decide when transactions begin (see `_on_begin`).
        dbapi_conn.isolation_level = None
        cursor = dbapi_conn.cursor()
        cursor.execute("PRAGMA journal_mode=WAL")
        cursor.execute("PRAGMA synchronous=NORMAL")
        cursor.execute("PRAGMA foreign_keys=ON")
        cursor.close()

    @event.listens_for(engine, "begin")
    def _on_begin(conn: Any) -> None:
        # Take the write lock up front: a read that later upgrades to a write can deadlock.
        conn.exec_driver_sql("BEGIN IMMEDIATE")

    return engine


def make_session_factory(engine: Engine) -> sessionmaker[Session]:
    return sessionmaker(engine, expire_on_commit=False)


@contextmanager
def transaction(factory: sessionmaker[Session]) -> Iterator[Session]:
    """One unit of work: commit on success, roll back on any error."""
    with factory.begin() as session:
        yield session
