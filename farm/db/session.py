"""Engines and sessions. SQLite gets WAL, a busy timeout and BEGIN IMMEDIATE so several
worker processes can share one file without 'database is locked' upgrade deadlocks."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from sqlalchemy import Engine, create_engine, event, make_url
from sqlalchemy.orm import Session, sessionmaker

from farm.config import Settings


def make_engine(settings: Settings, *, url: str | None = None) -> Engine:
    url = url or settings.database_url
    if url.startswith("sqlite"):
        return _sqlite_engine(url, settings)
    return _postgres_engine(url, settings)


def _postgres_engine(url: str, settings: Settings, **options: Any) -> Engine:
    return create_engine(
        url,
        echo=settings.database.echo,
        pool_size=settings.database.pool_size,
        max_overflow=settings.database.pool_size,
        # No pre-ping round trip per checkout: a dead connection fails its statement, the pool
        # drops every connection of that generation, and the stage (or the API client) retries.
        pool_pre_ping=settings.database.pool_pre_ping,
        **options,
    )


def libpq_url(url: str) -> str:
    """A SQLAlchemy PostgreSQL URL (``postgresql+psycopg://...``) as libpq and psycopg take it."""
    return make_url(url).set(drivername="postgresql").render_as_string(hide_password=False)


def make_autocommit_engine(settings: Settings, *, url: str | None = None, durable: bool) -> Engine | None:
    """PostgreSQL: an engine whose statements commit one by one, for the one-statement claims
    and completions of ``farm.db.jobs.claims`` and ``farm.db.jobs.completions``; that saves the BEGIN and
    COMMIT round trips. Unless ``durable``, its commits do not wait for the WAL to reach the disk
    (``synchronous_commit`` off, ~2 ms less per statement): for the writes a database crash may
    lose without harm (claims, INIT and RUN completions; see ``jobrows.commit_early``). A
    completion that finishes a job goes through a durable one. None on SQLite, where every
    write goes through a transaction."""
    url = url or settings.database_url
    if url.startswith("sqlite"):
        return None
    return _postgres_engine(
        url,
        settings,
        isolation_level="AUTOCOMMIT",
        connect_args={} if durable else {"options": "-c synchronous_commit=off"},
    )


def _sqlite_engine(url: str, settings: Settings) -> Engine:
    path = url.split("///", 1)[-1]
    if path and path != ":memory:":
        Path(path).parent.mkdir(parents=True, exist_ok=True)
    engine = create_engine(
        url,
        echo=settings.database.echo,
        connect_args={"timeout": settings.database.sqlite_busy_timeout_s, "check_same_thread": False},
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
