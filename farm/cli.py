"""``farm``: the one command-line entry point. Settings are built here, once, from the
environment (``FARM_*``), and passed down."""

from __future__ import annotations

import ctypes
import ctypes.util
import json
import signal
import sys
import time
from pathlib import Path
from typing import Any

import click
from rich.console import Console

from farm.config import Settings
from farm.constants import Stage

# Piped output (CI logs, `| tee`) gets room for the closing tables instead of rich's 80 columns.
console = Console(stderr=True, width=None if sys.stderr.isatty() else 120)


def _settings() -> Settings:
    return Settings()


def _client(settings: Settings, url: str | None) -> Any:
    from farm.client import FarmClient
    from farm.embedded import token_file

    token = settings.api.token.get_secret_value() if settings.api.token else None
    if token is None and token_file(settings).is_file():
        token = token_file(settings).read_text().strip()
    return FarmClient(url or settings.api_url, token=token)


class _FarmGroup(click.Group):
    """Answers the errors a user causes or meets (the API refused, the API is not up) with one
    line and an exit status, never a traceback."""

    def invoke(self, ctx: click.Context) -> Any:
        import httpx

        from farm.errors import ApiError, ConfigError

        try:
            return super().invoke(ctx)
        except ApiError as exc:
            console.print(f"[red]error ({exc.status} {exc.code}):[/] {exc.detail}", highlight=False)
            ctx.exit(2)
        except ConfigError as exc:
            console.print(f"[red]error:[/] {exc}", highlight=False)
            ctx.exit(1)
        except httpx.TransportError as exc:
            url = str(exc.request.url.copy_with(path="/", query=None)) if _has_request(exc) else "the API"
            console.print(
                f"[red]error:[/] cannot reach the farm API at {url} ({exc or type(exc).__name__}); "
                "is it up (`farm up`), and are --url or FARM_API__HOST/FARM_API__PORT right?",
                highlight=False,
            )
            ctx.exit(1)


def _has_request(exc: Exception) -> bool:
    try:
        return getattr(exc, "request", None) is not None
    except RuntimeError:  # httpx raises when an error was made without a request
        return False


@click.group(cls=_FarmGroup)
@click.version_option(package_name="rollout-farm")
def main() -> None:
    """rollout-farm: run agent rollouts as a service and hand back token-exact trajectories."""


@main.command()
@click.option("--host", default=None, help="bind address (default: FARM_API__HOST)")
@click.option("--port", type=int, default=None, help="port (default: FARM_API__PORT)")
def api(host: str | None, port: int | None) -> None:
    """Serve the HTTP facade with uvicorn."""
    import uvicorn

    from farm.api.app import create_app

    settings = _settings()
    _keep_freed_memory()
    uvicorn.run(
        create_app(settings),
        host=host or settings.api.host,
        port=port or settings.api.port,
        log_level="info",
        timeout_graceful_shutdown=5,
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
    import socket

    import uvicorn

    from farm.proxy.app import create_proxy_app

    settings = _settings()
    tcp = socket.create_server((host or settings.proxy.host, port or settings.proxy.port), reuse_port=False)
    sockets = [tcp]
    path = socket_path or settings.proxy.socket
    if path is not None:
        path.unlink(missing_ok=True)
        unix = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        unix.bind(str(path))
        path.chmod(0o666)  # sandboxed harnesses run as another uid; the trial key is the access control
        sockets.append(unix)
    processes = processes or settings.proxy.processes
    if processes == 1:
        config = uvicorn.Config(create_proxy_app(settings), log_level="info", timeout_graceful_shutdown=5)
        uvicorn.Server(config).run(sockets=sockets)
        return
    from uvicorn.supervisors import Multiprocess

    # One event loop serves a process's calls one slice at a time; more processes on the same sockets
    # let the kernel spread calls over cores. uvicorn's supervisor spawns them (an app by import
    # string: each child builds its own from the same environment) and replaces one that dies.
    config = uvicorn.Config(
        "farm.cli:proxy_app_from_environment",
        factory=True,
        workers=processes,
        log_level="info",
        timeout_graceful_shutdown=5,
    )
    Multiprocess(config, sockets=sockets).run()


def proxy_app_from_environment() -> Any:
    """The proxy app of one of ``farm proxy --processes N``'s children (settings from its environment)."""
    from farm.proxy.app import create_proxy_app

    return create_proxy_app(_settings())


#: glibc ``mallopt`` parameters, and what the API sets them to (see ``_keep_freed_memory``).
_M_TRIM_THRESHOLD, _M_TOP_PAD, _M_MMAP_THRESHOLD = -1, -2, -3
_API_MALLOC = {_M_MMAP_THRESHOLD: 32 << 20, _M_TRIM_THRESHOLD: 256 << 20, _M_TOP_PAD: 64 << 20}


def _keep_freed_memory() -> None:
    """Let the API process reuse the memory it frees instead of handing it back to the kernel.

    A results page moves megabytes through several buffers (libpq's, the rows', the socket's);
    with glibc's defaults each buffer that size is fresh memory, page-faulted in again on every
    page, and that costs the API more CPU than the rest of the page together. The price is up
    to 256 MB the process keeps after a burst. Not glibc (musl, macOS): nothing to do.
    """
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        mallopt = libc.mallopt
    except (OSError, AttributeError):
        return
    for param, value in _API_MALLOC.items():
        mallopt(param, value)


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
        run_worker(_settings(), _parse_stages(queues), concurrency=concurrency, pool=pool, loglevel=loglevel)
    except FarmError as exc:  # e.g. a sandbox driver that cannot work here: say why, take no job
        raise click.ClickException(str(exc)) from exc


@main.command()
def reap() -> None:
    """Remove this node's sandboxes whose owner process died or whose wall time ran out (a node's
    exit script runs it once its workers are gone: mounts undone, instances stopped)."""
    from farm.sandbox import reap_sandboxes

    reaped = reap_sandboxes(_settings())
    console.print(f"reaped {len(reaped)} sandbox(es)" + (f": {', '.join(reaped)}" if reaped else ""))


@main.command()
@click.argument("job_id", type=int)
@click.option("--json", "as_json", is_flag=True, help="print the report as JSON")
def replay(job_id: int, as_json: bool) -> None:
    """Run a finished job's recorded tool calls again, in a fresh sandbox made as INIT made its own,
    without the model, and compare every observation and the reward with the record (exit status 1
    when any differ, 2 when the job cannot be replayed). Runs here, on the database and sandbox
    runtime of FARM_* (as a worker would)."""
    from rich.markup import escape

    from farm.db.session import make_engine
    from farm.errors import FarmError
    from farm.worker.replay import replay_job

    settings = _settings()
    engine = make_engine(settings)
    try:
        with console.status(f"replaying job {job_id}..."):
            report = replay_job(settings, engine, job_id)
    except FarmError as exc:  # not replayable here (no record, unknown job or task type, no sandbox)
        console.print(f"[red]cannot replay:[/] {escape(str(exc))}", highlight=False)
        sys.exit(2)
    finally:
        engine.dispose()
    if as_json:
        print(json.dumps(report.to_dict()))
    else:
        for step in report.differing:
            where = step.first_difference
            line = f"line {where.line}" if where else "a part of the output not recorded"
            head = f"[red]step {step.index}[/] (turn {step.turn}, {step.tool})"
            console.print(f"{head} differs at {line}", highlight=False)
            console.print(f"  call:     {json.dumps(step.arguments)[:300]}", highlight=False, markup=False)
            if where is not None:
                console.print(f"  recorded: {where.recorded!r}", highlight=False, markup=False)
                console.print(f"  replayed: {where.replayed!r}", highlight=False, markup=False)
        verdict = "[green]reproduced[/]" if report.reproduced else "[red]not reproduced[/]"
        console.print(
            f"job {job_id} ({report.type}): {verdict}: {len(report.steps)} steps replayed, "
            f"{len(report.differing)} differ; reward {report.recorded_reward} recorded, "
            f"{report.replayed_reward} replayed",
            highlight=False,
        )
    if not report.reproduced:
        sys.exit(1)


@main.command()
@click.option("--revision", default="head", show_default=True)
@click.option("--downgrade", is_flag=True, help="downgrade to --revision instead of upgrading")
@click.option("--check", is_flag=True, help="fail if the models and the migrations differ")
def migrate(revision: str, downgrade: bool, check: bool) -> None:
    """Apply the database migrations."""
    from farm.db import migrate as m
    from farm.db.session import make_engine

    engine = make_engine(_settings())
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

    settings = _settings()
    run_flower(settings, port=port or settings.flower.port, address=address)


@main.command()
@click.option("--flower/--no-flower", default=True, show_default=True)
def up(flower: bool) -> None:
    """Start the embedded single-machine stack in the foreground; Ctrl-C stops it all."""
    from farm.embedded import EmbeddedStack, token_hint

    stack = EmbeddedStack(_settings(), with_flower=flower)
    started = time.monotonic()
    stack.start(report=lambda step: console.print(f"[dim]{time.monotonic() - started:5.1f}s[/] {step}"))
    s = stack.settings
    console.print(f"[bold green]farm is up[/]  API {s.api_url}  (docs {s.api_url}/docs)")
    console.print(f"  redis {s.redis.url}   database {s.database_url}")
    if flower:
        console.print(f"  flower http://127.0.0.1:{s.flower.port}")
    console.print(f"  {token_hint(s)}   logs in {stack.log_dir}")
    stopping = False

    def _stop(*_: Any) -> None:
        nonlocal stopping
        stopping = True

    signal.signal(signal.SIGTERM, _stop)
    try:
        while not stopping:
            if dead := stack.failed():
                console.print(f"[red]{dead[0].name} exited:[/]\n{stack.tail(dead[0])}")
                break
            time.sleep(0.5)
    except KeyboardInterrupt:
        pass
    finally:
        with console.status("stopping..."):
            stack.stop()
        console.print("stopped")


def _read_tasks(path: Path) -> list[dict[str, Any]]:
    tasks = []
    for n, line in enumerate(path.read_text().splitlines(), start=1):
        if not line.strip():
            continue
        try:
            tasks.append(json.loads(line))
        except json.JSONDecodeError as exc:
            raise click.BadParameter(f"{path}:{n}: not JSON ({exc.msg})") from exc
    if not tasks:
        raise click.BadParameter(f"{path} holds no task")
    return tasks


@main.command()
@click.argument("file", type=click.Path(exists=True, dir_okay=False, path_type=Path))
@click.option("--group-size", "-n", type=int, default=1, show_default=True)
@click.option("--temperature", type=float, default=1.0, show_default=True)
@click.option("--max-tokens", type=int, default=1024, show_default=True)
@click.option("--seed", type=int, default=None)
@click.option("--idempotency-key", default=None)
@click.option("--out", type=click.Path(dir_okay=False, path_type=Path), default=None, help="write results as JSONL")
@click.option("--wait/--no-wait", default=True, show_default=True)
@click.option("--url", default=None, help="API URL (default: from settings)")
def submit(
    file: Path,
    group_size: int,
    temperature: float,
    max_tokens: int,
    seed: int | None,
    idempotency_key: str | None,
    out: Path | None,
    wait: bool,
    url: str | None,
) -> None:
    """Submit FILE (JSONL, one task spec per line: {"type": ..., "config": {...}}) and follow it."""
    from farm.errors import ApiError
    from farm.progress import follow, summarize, summary_table

    tasks = _read_tasks(file)
    with _client(_settings(), url) as client:
        try:
            batch = client.submit(
                tasks,
                group_size=group_size,
                idempotency_key=idempotency_key,
                sampling={"temperature": temperature, "max_tokens": max_tokens, "seed": seed},
            )
        except ApiError as exc:
            console.print(f"[red]refused ({exc.status} {exc.code}):[/] {exc.detail}")
            sys.exit(2)
        console.print(f"batch [bold]{batch.id}[/]: {len(batch.job_ids)} jobs")
        if not wait:
            return
        sink = open(out, "w") if out else None  # noqa: SIM115
        try:
            results = follow(client, batch.id, len(batch.job_ids), console=console, out=sink)
        finally:
            if sink:
                sink.close()
        console.print(summary_table(summarize(results), title=f"batch {batch.id}"))


@main.command()
@click.argument("batch_id", type=int, required=False)
@click.option(
    "--watch/--once",
    default=None,
    help="redraw every 2 s until Ctrl-C (default: when the terminal is interactive)",
)
@click.option("--json", "as_json", is_flag=True, help="print the answer as JSON instead")
@click.option("--url", default=None)
def status(batch_id: int | None, watch: bool | None, as_json: bool, url: str | None) -> None:
    """The farm at a glance (pools, queues, backends, running batches), or one batch's status."""
    client_url = url or _settings().api_url
    with _client(_settings(), url) as client:
        if batch_id is not None:
            console.print_json(client.status(batch_id).model_dump_json())
            return
        if as_json:
            console.print_json(client.overview().model_dump_json())
            return
        from rich.live import Live

        from farm.errors import ApiError
        from farm.schemas import Health
        from farm.status_view import overview_view

        def view() -> Any:
            try:
                health = client.health()
            except ApiError as exc:  # /readyz says 503 with what is down: still show the rest
                health = Health(status="unavailable", checks={"readyz": exc.detail}, version="?")
            return overview_view(health, client.overview(), url=client_url)

        if not (watch if watch is not None else console.is_terminal):
            console.print(view())
            return
        with Live(view(), console=console, refresh_per_second=1, transient=False) as live:
            try:
                while True:
                    time.sleep(2.0)
                    live.update(view())
            except KeyboardInterrupt:
                pass


@main.command()
@click.argument("batch_id", type=int)
@click.option(
    "--out",
    type=click.Path(dir_okay=False, path_type=Path),
    default=None,
    help="the HTML page (default: batch-BATCH_ID.html)",
)
@click.option("--png/--no-png", default=True, show_default=True, help="also write the figures as one PNG next to it")
@click.option("--url", default=None)
def report(batch_id: int, out: Path | None, png: bool, url: str | None) -> None:
    """Write a self-contained HTML page (and a PNG) of a batch: a per-job INIT/RUN/EVAL timeline,
    throughput, outcomes and rewards per task type."""
    from farm.report import fetch_results, render

    html_path = out or Path(f"batch-{batch_id}.html")
    png_path = html_path.with_suffix(".png") if png else None
    with _client(_settings(), url) as client:
        status = client.status(batch_id)
        with console.status(f"reading batch {batch_id}'s results..."):
            results = fetch_results(client, batch_id)
    render(status, results, html_path=html_path, png_path=png_path)
    console.print(f"wrote {html_path}" + (f" and {png_path}" if png_path else "") + f" ({len(results)} finished jobs)")


@main.command()
@click.argument("batch_id", type=int)
@click.option("--url", default=None)
def cancel(batch_id: int, url: str | None) -> None:
    """Cancel a batch."""
    with _client(_settings(), url) as client:
        console.print_json(client.cancel(batch_id).model_dump_json())


@main.command()
@click.argument("batch_id", type=int)
@click.option("--force", is_flag=True, help="also score rollouts whose grader is not safe to run again (harbor)")
@click.option(
    "--record", is_flag=True, help="keep each new score in the job's stage_data['reverify'] (rewards never change)"
)
@click.option("--json", "as_json", is_flag=True, help="print the report as JSON")
def reverify(batch_id: int, force: bool, record: bool, as_json: bool) -> None:
    """Score a batch's finished rollouts again with the graders installed here, without the model or
    the agent, and list those whose reward changed. Runs here, on the database and sandbox runtime of
    FARM_* (as a worker would): code and swe graders start sandboxes."""
    from farm.db.session import make_engine
    from farm.errors import FarmError, ReverifyRefused
    from farm.worker.reverify import reverify_batch

    settings = _settings()
    engine = make_engine(settings)
    try:
        with console.status(f"scoring batch {batch_id} again..."):
            report = reverify_batch(settings, engine, batch_id, force=force, record=record)
    except ReverifyRefused as exc:
        console.print(f"[red]refused:[/] {exc}", highlight=False)
        sys.exit(2)
    except FarmError as exc:
        raise click.ClickException(str(exc)) from exc
    finally:
        engine.dispose()
    if as_json:
        rows = [vars(r) | {"changed": r.changed} for r in report.rescores]
        print(json.dumps({"batch_id": batch_id, "forced": report.forced, "recorded": record, "rollouts": rows}))
        return
    _print_reverify(report)


def _print_reverify(report: Any) -> None:
    from rich.table import Table

    table = Table(title=f"batch {report.batch_id}: rewards that changed")
    for column in ("job", "type", "old reward", "new reward"):
        table.add_column(column)
    for r in report.changed:
        table.add_row(str(r.job_id), r.type, str(r.old_reward), str(r.new_reward))
    if report.changed:
        console.print(table)
    for r in report.errors:
        console.print(f"[yellow]job {r.job_id} ({r.type}) not scored:[/] {r.error.splitlines()[0]}", highlight=False)
    if report.forced:
        console.print(f"[yellow]forced:[/] {report.forced}", highlight=False)
    scored = len(report.rescores) - len(report.errors)
    note = " (new scores recorded in stage_data['reverify'])" if report.recorded else ""
    console.print(f"{scored} rollouts scored again, {len(report.changed)} changed, {len(report.errors)} failed{note}")


@main.command()
@click.option("--tasks", "num_tasks", type=int, default=16, show_default=True)
@click.option("--group-size", "-n", type=int, default=4, show_default=True)
def demo(num_tasks: int, group_size: int) -> None:
    """Start the embedded stack, run a demo batch through INIT/RUN/EVAL, show the results, stop."""
    from farm.demo import run_demo

    sys.exit(run_demo(_settings(), num_tasks=num_tasks, group_size=group_size, console=console))


def _mount_optional_groups() -> None:
    try:
        from farm.llm.builtin.cli import llm
    except ImportError:
        return
    main.add_command(llm)


_mount_optional_groups()

if __name__ == "__main__":  # `python -m farm.cli ...` works as `python -m farm ...` and `farm ...`
    main()
