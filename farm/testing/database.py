"""Throwaway PostgreSQL databases for tests and benchmarks."""

from __future__ import annotations

import contextlib
import secrets
from collections.abc import Iterator

import sqlalchemy as sa

from farm.config import Settings
from farm.db import migrate
from farm.db.session import make_engine


@contextlib.contextmanager
def temporary_database(server_url: str, *, prefix: str = "farm_tmp", migrated: bool = True) -> Iterator[str]:
    """A new PostgreSQL database on the server of ``server_url`` (any database URL there),
    migrated to head unless told otherwise, dropped on exit; yields its URL."""
    base, _, _ = server_url.rpartition("/")
    # No pool: the server may have been restarted (crash tests) by the time the database is dropped.
    admin = sa.create_engine(f"{base}/postgres", isolation_level="AUTOCOMMIT", poolclass=sa.pool.NullPool)
    name = f"{prefix}_{secrets.token_hex(4)}"
    with admin.connect() as conn:
        conn.execute(sa.text(f'CREATE DATABASE "{name}"'))
    url = f"{base}/{name}"
    try:
        if migrated:
            engine = make_engine(Settings(), url=url)
            try:
                migrate.upgrade(engine)
            finally:
                engine.dispose()
        yield url
    finally:
        with admin.connect() as conn:
            conn.execute(sa.text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
        admin.dispose()
