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
def temporary_database(
    server_url: str, *, prefix: str = "farm_tmp", migrated: bool = True, wait_for_disk: bool = True
) -> Iterator[str]:
    """A new PostgreSQL database on the server of ``server_url`` (any database URL there),
    migrated to head unless told otherwise, dropped on exit; yields its URL.

    ``wait_for_disk`` False: its commits do not wait for the WAL to reach the disk
    (``synchronous_commit = off``), for tests whose server is never killed: a commit is as
    visible and as ordered as before, only not yet on disk when it returns."""
    base, _, _ = server_url.rpartition("/")
    # No pool: the server may have been restarted (crash tests) by the time the database is dropped.
    admin = sa.create_engine(f"{base}/postgres", isolation_level="AUTOCOMMIT", poolclass=sa.pool.NullPool)
    name = f"{prefix}_{secrets.token_hex(4)}"
    with admin.connect() as conn:
        conn.execute(sa.text(f'CREATE DATABASE "{name}"'))
        if not wait_for_disk:
            conn.execute(sa.text(f'ALTER DATABASE "{name}" SET synchronous_commit = off'))
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
