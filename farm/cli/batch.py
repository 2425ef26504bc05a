"""Commands that talk to a running farm's API: submit a batch and follow it, status, report,
cancel; and the demo, which starts its own."""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path
from typing import Any, Literal

import click

from farm.cli.base import EXIT_REFUSED, api_client, console, load_settings, main, print_json
from farm.cli.base import out as stdout

#: ``farm submit``'s tokens per model turn, unless the served model's context asks for fewer.
DEFAULT_MAX_TOKENS = 1024
#: a turn takes at most this share of the context: a multi-turn episode needs room for its prompt,
#: its observations and several replies (1,024 on a 2,048-token model filled it in one turn).
CONTEXT_SHARE = 8


def _fitting_max_tokens(client: Any) -> int:
    """``DEFAULT_MAX_TOKENS``, or less when the smallest context the farm's backends serve asks for it."""
    contexts: list[int] = [b.context_tokens for b in client.overview().backends if b.healthy and b.context_tokens]
    if not contexts or min(contexts) // CONTEXT_SHARE >= DEFAULT_MAX_TOKENS:
        return DEFAULT_MAX_TOKENS
    fitted = max(1, min(contexts) // CONTEXT_SHARE)
    console.print(
        f"max tokens per turn: {fitted} (1/{CONTEXT_SHARE} of the served model's {min(contexts)}-token context; "
        "--max-tokens to choose)",
        highlight=False,
    )
    return fitted


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
@click.option(
    "--max-tokens",
    type=click.IntRange(min=1),
    default=None,
    help=f"per model turn (default: {DEFAULT_MAX_TOKENS}, at most 1/{CONTEXT_SHARE} of the served model's context)",
)
@click.option("--seed", type=int, default=None)
@click.option("--idempotency-key", default=None)
@click.option(
    "--history",
    type=click.Choice(["exact", "template"]),
    default=None,
    help="the batch's history policy where a chat template rewrites earlier turns (default: the farm's, exact)",
)
@click.option("--out", type=click.Path(dir_okay=False, path_type=Path), default=None, help="write results as JSONL")
@click.option(
    "--wait/--no-wait",
    default=True,
    show_default=True,
    help="follow the batch to its end; --no-wait prints the batch id alone on stdout",
)
@click.option("--json", "as_json", is_flag=True, help="print the result as JSON (the batch created, and its summary)")
@click.option("--url", default=None, help="API URL (default: from settings)")
def submit(
    file: Path,
    group_size: int,
    temperature: float,
    max_tokens: int | None,
    seed: int | None,
    idempotency_key: str | None,
    history: Literal["exact", "template"] | None,
    out: Path | None,
    wait: bool,
    as_json: bool,
    url: str | None,
) -> None:
    """Submit FILE (JSONL, one task spec per line: {"type": ..., "config": {...}}) and follow it.

    On stdout: the batch id (--no-wait), or the summary table of the finished batch; the progress
    goes to stderr."""
    from farm.errors import ApiError
    from farm.progress import follow, summarize, summary_table

    tasks = _read_tasks(file)
    with api_client(load_settings(), url) as client:
        if max_tokens is None:
            max_tokens = _fitting_max_tokens(client)
        try:
            batch = client.submit(
                tasks,
                group_size=group_size,
                idempotency_key=idempotency_key,
                sampling={"temperature": temperature, "max_tokens": max_tokens, "seed": seed},
                history=history,
            )
        except ApiError as exc:
            console.print(f"[red]refused ({exc.status} {exc.code}):[/] {exc.detail}", highlight=False, soft_wrap=True)
            for problem in exc.errors or []:
                console.print(f"  {problem.get('field')}: {problem.get('detail')}", highlight=False, markup=False)
            sys.exit(EXIT_REFUSED if exc.status < 500 else 1)
        console.print(f"batch [bold]{batch.id}[/]: {len(batch.job_ids)} jobs")
        if not wait:
            if as_json:
                print_json(batch)
            else:
                click.echo(batch.id)
            return
        sink = open(out, "w") if out else None  # noqa: SIM115
        try:
            results = follow(client, batch.id, len(batch.job_ids), console=console, out=sink)
        finally:
            if sink:
                sink.close()
        summaries = summarize(results)
        if as_json:
            print_json({"batch": batch.model_dump(mode="json"), "summary": _summary_json(summaries)})
        else:
            stdout.print(summary_table(summaries, title=f"batch {batch.id}"))


def _summary_json(summaries: dict[str, Any]) -> dict[str, Any]:
    """The closing table as JSON: per task type, its jobs, outcomes and means."""
    import statistics

    def mean(values: list[Any]) -> float | None:
        return statistics.fmean(values) if values else None

    return {
        name: {
            "jobs": s.jobs,
            "outcomes": dict(s.outcomes),
            "mean_reward": mean(s.rewards),
            "mean_turns": mean(s.turns),
            "mean_tokens": mean(s.tokens),
        }
        | {f"mean_{key}": mean(values) for key, values in s.stage_s.items()}
        for name, s in sorted(summaries.items())
    }


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
    """The farm at a glance (pools, queues, backends, running batches), or one batch's status, on
    stdout (--json: the API's answer)."""
    settings = load_settings()
    client_url = url or settings.api_url
    with api_client(settings, url) as client:
        if batch_id is not None:
            batch = client.status(batch_id)
            if as_json:
                print_json(batch)
            else:
                from farm.status_view import batch_view

                stdout.print(batch_view(batch))
            return
        if as_json:
            print_json(client.overview())
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

        if not (watch if watch is not None else stdout.is_terminal):
            stdout.print(view())
            return
        with Live(view(), console=stdout, refresh_per_second=1, transient=False) as live:
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
    throughput, outcomes and rewards per task type. Prints the paths written on stdout, one a line."""
    from farm.report import fetch_results, render

    html_path = out or Path(f"batch-{batch_id}.html")
    png_path = html_path.with_suffix(".png") if png else None
    with api_client(load_settings(), url) as client:
        status = client.status(batch_id)
        with console.status(f"reading batch {batch_id}'s results..."):
            results = fetch_results(client, batch_id)
    render(status, results, html_path=html_path, png_path=png_path)
    console.print(f"wrote {len(results)} finished jobs' report:", highlight=False)
    for path in (html_path, png_path):
        if path is not None:
            click.echo(path)


@main.command()
@click.argument("batch_id", type=int)
@click.option("--json", "as_json", is_flag=True, help="print the batch's status as JSON instead")
@click.option("--url", default=None)
def cancel(batch_id: int, as_json: bool, url: str | None) -> None:
    """Cancel a batch; prints its status after the cancel on stdout."""
    with api_client(load_settings(), url) as client:
        batch = client.cancel(batch_id)
    if as_json:
        print_json(batch)
    else:
        from farm.status_view import batch_view

        stdout.print(batch_view(batch))


@main.command()
@click.option("--tasks", "num_tasks", type=int, default=16, show_default=True)
@click.option("--group-size", "-n", type=int, default=4, show_default=True)
@click.option(
    "--learn-steps",
    type=click.IntRange(min=0),
    default=3,  # farm.demo.DEMO_LOOP.steps (not imported here: the CLI starts without it)
    show_default=True,
    help="GRPO steps of the closing learning loop (0: none)",
)
@click.option("--keep", is_flag=True, help="leave the stack up afterwards (Ctrl-C stops it)")
def demo(num_tasks: int, group_size: int, learn_steps: int, keep: bool) -> None:
    """Start the embedded stack, run a batch of the shipped task types through INIT/RUN/EVAL, then a
    short GRPO loop that moves a reward; results on stdout, progress on stderr; stop (unless --keep)."""
    from farm.demo import run_demo

    code = run_demo(
        load_settings(),
        num_tasks=num_tasks,
        group_size=group_size,
        learn_steps=learn_steps,
        keep=keep,
        console=console,
        out=stdout,
    )
    sys.exit(code)
