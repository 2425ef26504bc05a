"""Commands that run a farm process in the foreground: the API, the proxy, a worker, Flower, the
embedded stack; and the node chores around them (migrations, reaping sandboxes)."""

from __future__ import annotations

import time
from pathlib import Path

import click

from farm.cli.base import console, load_settings, main, out
from farm.cli.memory import keep_freed_memory
from farm.cli.process import bind_proxy_sockets, headers_deadline, serve_proxy
from farm.constants import Stage


@main.command()
@click.option("--host", default=None, help="bind address (default: FARM_API__HOST)")
@click.option("--port", type=int, default=None, help="port (default: FARM_API__PORT)")
def api(host: str | None, port: int | None) -> None:
    """Serve the HTTP facade with uvicorn."""
    import uvicorn

    from farm.api.app import create_app
    from farm.db.budget import api_pools

    settings = load_settings()
    click.echo(f"database connections of this API process: {api_pools(settings).describe()}", err=True)
    keep_freed_memory()
    uvicorn.run(
        create_app(settings),
        host=host or settings.api.host,
        port=port or settings.api.port,
        log_level="info",
        timeout_graceful_shutdown=5,
        # Its proxy routes face harnesses as ``farm proxy`` does: a client trickling its headers is closed.
        http=headers_deadline(settings.api.read_timeout_s),
    )


@main.command()
@click.option("--host", default=None, help="bind address (default: FARM_PROXY__HOST)")
@click.option("--port", type=int, default=None, help="port (default: FARM_PROXY__PORT)")
@click.option(
    "--socket",
    "socket_path",
    type=click.Path(path_type=Path),
    default=None,
    help="also listen on this Unix socket (default: FARM_PROXY__SOCKET)",
)
@click.option(
    "--processes",
    type=click.IntRange(min=1),
    default=None,
    help="serving processes sharing the sockets (default: FARM_PROXY__PROCESSES)",
)
def proxy(host: str | None, port: int | None, socket_path: Path | None, processes: int | None) -> None:
    """Serve the OpenAI/Anthropic-compatible proxy on its own (the API serves it too)."""
    settings = load_settings()
    sockets = bind_proxy_sockets(settings, host=host, port=port, unix_path=socket_path)
    serve_proxy(settings, sockets, processes=processes or settings.proxy.processes)


def _parse_stages(value: str) -> list[Stage]:
    try:
        return [Stage(v.strip()) for v in value.split(",") if v.strip()]
    except ValueError as exc:
        raise click.BadParameter(f"{exc}; use a comma-separated list of init, run, eval") from exc


@main.command()
@click.option("--queues", "-Q", default="init,run,eval", show_default=True, help="stages this worker serves")
@click.option("--concurrency", "-c", type=int, default=None, help="default: the sum of the stages' settings")
@click.option("--pool", "-P", default=None, help="threads (default), prefork, solo")
@click.option("--loglevel", "-l", default="INFO", show_default=True)
def worker(queues: str, concurrency: int | None, pool: str | None, loglevel: str) -> None:
    """Run a Celery worker for some stages on this node (RUN/EVAL consume this node's queues)."""
    from farm.errors import FarmError
    from farm.worker.process import run_worker

    try:
        run_worker(load_settings(), _parse_stages(queues), concurrency=concurrency, pool=pool, loglevel=loglevel)
    except FarmError as exc:  # e.g. a sandbox driver that cannot work here: say why, take no job
        raise click.ClickException(str(exc)) from exc


@main.command()
def reap() -> None:
    """Remove this node's sandboxes whose owner process died or whose wall time ran out (a node's
    exit script runs it once its workers are gone: mounts undone, instances stopped)."""
    from farm.sandbox import reap_sandboxes, sandbox_root
    from farm.sandbox.leftovers import find_leftovers

    settings = load_settings()
    reaped = reap_sandboxes(settings)
    out.print(f"reaped {len(reaped)} sandbox(es)" + (f": {', '.join(reaped)}" if reaped else ""))
    # What is still there (live sandboxes, or something teardown could not remove), from the kernel's tables.
    out.print(f"left on this node: {find_leftovers(sandbox_root(settings), ids=set(reaped)).describe()}")


@main.command()
@click.option("--revision", default="head", show_default=True)
@click.option("--downgrade", is_flag=True, help="downgrade to --revision instead of upgrading")
@click.option("--check", is_flag=True, help="fail if the models and the migrations differ")
def migrate(revision: str, downgrade: bool, check: bool) -> None:
    """Apply the database migrations."""
    from farm.db import migrate as m
    from farm.db.session import make_engine

    engine = make_engine(load_settings())
    try:
        if check:
            m.check(engine)
        elif downgrade:
            m.downgrade(engine, revision)
        else:
            m.upgrade(engine, revision)
    finally:
        engine.dispose()
    console.print(f"[green]database at {'checked' if check else revision}[/]")


@main.command()
@click.option("--port", type=int, default=None, help="default: FARM_FLOWER__PORT")
@click.option("--address", default="127.0.0.1", show_default=True, help="bind address")
def flower(port: int | None, address: str) -> None:
    """Run Flower on the farm's Celery cluster."""
    from farm.worker.flower import run_flower

    settings = load_settings()
    run_flower(settings, port=port or settings.flower.port, address=address)


@main.command()
@click.option("--flower/--no-flower", default=True, show_default=True)
def up(flower: bool) -> None:
    """Start the embedded single-machine stack in the foreground; Ctrl-C stops it all."""
    from farm.embedded import EmbeddedStack, token_hint

    stack = EmbeddedStack(load_settings(), with_flower=flower)
    started = time.monotonic()
    stack.start(report=lambda step: console.print(f"[dim]{time.monotonic() - started:5.1f}s[/] {step}"))
    s = stack.settings
    # Where the farm is: the command's result, on stdout (start-up steps went to stderr).
    out.print(f"[bold green]farm is up[/]  API {s.api_url}  (docs {s.api_url}/docs)")
    out.print(f"  redis {s.redis.url}   database {s.database_url}")
    if flower:
        out.print(f"  flower http://127.0.0.1:{s.flower.port}")
    out.print(f"  {token_hint(s)}   logs in {stack.log_dir}")
    try:
        if dead := stack.serve_until_stopped():
            console.print(f"[red]{dead.name} exited:[/]\n{stack.tail(dead)}")
    finally:
        with console.status("stopping..."):
            stack.stop()
        console.print("stopped")
