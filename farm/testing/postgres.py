"""A throwaway PostgreSQL cluster of a benchmark's own: its own ``max_connections`` and preloaded
libraries (``pg_stat_statements``), so filling it up or counting its statements touches no other
user of the machine's server."""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
import tempfile
from collections.abc import Iterator, Mapping
from pathlib import Path

from farm.testing.pgbouncer import free_port


def pg_binary(name: str) -> str:
    """Debian keeps ``initdb`` and ``pg_ctl`` under /usr/lib/postgresql/<version>/bin."""
    found = shutil.which(name)
    if found:
        return found
    candidates = sorted(Path("/usr/lib/postgresql").glob(f"*/bin/{name}"))
    if not candidates:
        raise FileNotFoundError(f"{name} not found (apt-get install postgresql)")
    return str(candidates[-1])


def _as_postgres(args: list[str]) -> None:
    # initdb and pg_ctl refuse to run as root.
    if os.geteuid() == 0:
        args = ["runuser", "-u", "postgres", "--", *args]
    subprocess.run(args, check=True, capture_output=True, text=True)


@contextlib.contextmanager
def private_postgres(options: Mapping[str, str]) -> Iterator[str]:
    """A new cluster on a free port with the ``postgresql.conf`` ``options`` given (fsync off: only
    processes stop here, never the machine), trust authentication; yields the URL of its
    ``postgres`` database; stopped and deleted on exit."""
    root = Path(tempfile.mkdtemp(prefix="farm-private-pg-"))
    data = root / "data"
    port = free_port()
    try:
        if os.geteuid() == 0:
            shutil.chown(root, "postgres", "postgres")
        _as_postgres([pg_binary("initdb"), "-D", str(data), "-U", "postgres", "--auth=trust", "--no-sync"])
        conf = {
            "listen_addresses": "127.0.0.1",
            "port": str(port),
            "unix_socket_directories": str(root),
            "fsync": "off",
            "full_page_writes": "off",
            **options,
        }
        with open(data / "postgresql.conf", "a") as out:
            out.writelines(f"{key} = '{value}'\n" for key, value in conf.items())
        _as_postgres([pg_binary("pg_ctl"), "-D", str(data), "-l", str(root / "server.log"), "-w", "-t", "60", "start"])
        yield f"postgresql+psycopg://postgres@127.0.0.1:{port}/postgres"
    finally:
        if (data / "postmaster.pid").exists():
            with contextlib.suppress(subprocess.CalledProcessError):
                _as_postgres([pg_binary("pg_ctl"), "-D", str(data), "-m", "immediate", "-w", "stop"])
        shutil.rmtree(root, ignore_errors=True)
