"""A throwaway PgBouncer in transaction mode in front of a PostgreSQL server, for tests and
benchmarks (Debian's ``pgbouncer`` package; docs/operations.md, "PgBouncer")."""

from __future__ import annotations

import contextlib
import os
import shutil
import socket
import subprocess
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from sqlalchemy import make_url

#: Debian installs it outside a plain user's PATH.
_CANDIDATES = ("pgbouncer", "/usr/sbin/pgbouncer")


def pgbouncer_binary() -> str | None:
    for name in _CANDIDATES:
        found = shutil.which(name)
        if found:
            return found
    return None


@dataclass(frozen=True)
class PgBouncer:
    """A running PgBouncer: ``url_of`` turns a database URL on its server into the same database through it."""

    port: int
    pid: int
    log: Path
    user: str

    def url_of(self, server_url: str) -> str:
        return make_url(server_url).set(host="127.0.0.1", port=self.port).render_as_string(hide_password=False)

    def show(self, what: str) -> list[dict[str, str]]:
        """``SHOW what`` on PgBouncer's admin console (``POOLS``, ``CLIENTS``, ``STATS``), one dict a row.
        Through ``psql``: the console speaks only the simple query protocol."""
        out = subprocess.run(
            ["psql", "-h", "127.0.0.1", "-p", str(self.port), "-U", self.user, "-d", "pgbouncer", "-AF", "\t"]
            + ["-c", f"SHOW {what}"],
            check=True,
            capture_output=True,
            text=True,
        ).stdout.splitlines()
        header = out[0].split("\t")
        return [dict(zip(header, line.split("\t"), strict=False)) for line in out[1:] if "\t" in line]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@contextlib.contextmanager
def private_pgbouncer(server_url: str, *, pool_size: int = 20, max_client_conn: int = 2000) -> Iterator[PgBouncer]:
    """PgBouncer in transaction mode on a free port, forwarding every database of ``server_url``'s
    server (trust authentication: as the test servers here) through at most ``pool_size`` server
    connections per database and user; stopped on exit. Run as ``postgres`` when this process is
    root (PgBouncer refuses to run as root)."""
    binary = pgbouncer_binary()
    if binary is None:
        raise FileNotFoundError("pgbouncer not found (apt-get install pgbouncer)")
    server = make_url(server_url)
    user = server.username or "postgres"
    root = Path(tempfile.mkdtemp(prefix="farm-pgbouncer-"))
    port = free_port()
    (root / "users.txt").write_text(f'"{user}" ""\n')
    (root / "pgbouncer.ini").write_text(
        "\n".join(
            [
                "[databases]",
                f"* = host={server.host or '127.0.0.1'} port={server.port or 5432}",
                "[pgbouncer]",
                "listen_addr = 127.0.0.1",
                f"listen_port = {port}",
                f"unix_socket_dir = {root}",
                "auth_type = trust",
                f"admin_users = {user}",
                f"auth_file = {root / 'users.txt'}",
                "pool_mode = transaction",
                f"default_pool_size = {pool_size}",
                f"max_client_conn = {max_client_conn}",
                f"pidfile = {root / 'pgbouncer.pid'}",
                # psycopg sends none, but an operator's JDBC or asyncpg client would.
                "ignore_startup_parameters = extra_float_digits",
                "",
            ]
        )
    )
    args = [binary, str(root / "pgbouncer.ini")]
    if os.geteuid() == 0:
        shutil.chown(root, "postgres", "postgres")
        for child in root.iterdir():
            shutil.chown(child, "postgres", "postgres")
        args = ["runuser", "-u", "postgres", "--", *args]
    log = root / "pgbouncer.log"
    with open(log, "ab") as out:
        process = subprocess.Popen(args, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        _wait_listening(port, process, log)
        yield PgBouncer(port=port, pid=process.pid, log=log, user=user)
    finally:
        if process.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(process.pid, 15)
            try:
                process.wait(10)
            except subprocess.TimeoutExpired:
                os.killpg(process.pid, 9)
                process.wait()
        shutil.rmtree(root, ignore_errors=True)


def _wait_listening(port: int, process: subprocess.Popen[bytes], log: Path, timeout_s: float = 15.0) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise OSError(f"pgbouncer exited with {process.returncode}: {log.read_text()[-2000:]}")
        with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port), timeout=0.5):
            return
        time.sleep(0.05)
    raise OSError(f"pgbouncer did not listen on {port} within {timeout_s}s: {log.read_text()[-2000:]}")
