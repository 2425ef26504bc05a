"""Commands that run a finished job's parts again here, on the database and sandbox runtime of
``FARM_*`` (as a worker would): ``replay`` its tool calls, ``reverify`` its score."""

from __future__ import annotations

import json
import sys
from typing import Any

import click

from farm.cli.base import EXIT_FAILED, EXIT_REFUSED, console, load_settings, main, out


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

    settings = load_settings()
    engine = make_engine(settings)
    try:
        with console.status(f"replaying job {job_id}..."):
            report = replay_job(settings, engine, job_id)
    except FarmError as exc:  # not replayable here (no record, unknown job or task type, no sandbox)
        console.print(f"[red]cannot replay:[/] {escape(str(exc))}", highlight=False)
        sys.exit(EXIT_REFUSED)
    finally:
        engine.dispose()
    if as_json:
        print(json.dumps(report.to_dict()))
    else:
        for step in report.differing:
            where = step.first_difference
            line = f"line {where.line}" if where else "a part of the output not recorded"
            head = f"[red]step {step.index}[/] (turn {step.turn}, {step.tool})"
            out.print(f"{head} differs at {line}", highlight=False)
            out.print(f"  call:     {json.dumps(step.arguments)[:300]}", highlight=False, markup=False)
            if where is not None:
                out.print(f"  recorded: {where.recorded!r}", highlight=False, markup=False)
                out.print(f"  replayed: {where.replayed!r}", highlight=False, markup=False)
        verdict = "[green]reproduced[/]" if report.reproduced else "[red]not reproduced[/]"
        out.print(
            f"job {job_id} ({report.type}): {verdict}: {len(report.steps)} steps replayed, "
            f"{len(report.differing)} differ; reward {report.recorded_reward} recorded, "
            f"{report.replayed_reward} replayed",
            highlight=False,
        )
    if not report.reproduced:
        sys.exit(EXIT_FAILED)


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
    from farm.errors import ReverifyRefused
    from farm.worker.reverify import reverify_batch

    settings = load_settings()
    engine = make_engine(settings)
    try:
        with console.status(f"scoring batch {batch_id} again..."):
            report = reverify_batch(settings, engine, batch_id, force=force, record=record)
    except ReverifyRefused as exc:
        console.print(f"[red]refused:[/] {exc}", highlight=False)
        sys.exit(EXIT_REFUSED)
    finally:  # a batch that does not exist (exit 2) or any other farm error (1): answered by the group
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
        out.print(table)
    for r in report.errors:
        out.print(f"[yellow]job {r.job_id} ({r.type}) not scored:[/] {r.error.splitlines()[0]}", highlight=False)
    if report.forced:
        out.print(f"[yellow]forced:[/] {report.forced}", highlight=False)
    scored = len(report.rescores) - len(report.errors)
    note = " (new scores recorded in stage_data['reverify'])" if report.recorded else ""
    out.print(f"{scored} rollouts scored again, {len(report.changed)} changed, {len(report.errors)} failed{note}")
