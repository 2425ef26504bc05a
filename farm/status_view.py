"""``farm status``: the farm at a glance, drawn with rich from ``GET /v1/overview``; and one batch
(``farm status BATCH``, ``farm cancel``) from ``GET /v1/batches/{id}``.

The database's connections (the farm's budget, those in use, the server's limit), pools (worker
processes and slots per node and stage, with the queue each consumes and the node's
sandboxes), backends with their load, and the running batches with their progress.
"""

from __future__ import annotations

from rich.console import Group
from rich.progress_bar import ProgressBar
from rich.table import Table
from rich.text import Text

from farm.constants import Stage
from farm.schemas import BatchStatus, Health, Overview

STAGES = (Stage.INIT, Stage.RUN, Stage.EVAL)


def overview_view(health: Health, overview: Overview, *, url: str) -> Group:
    ok = health.status == "ok"
    checks = ", ".join(f"{k} {v}" for k, v in sorted(health.checks.items()))
    title = Text.assemble(
        ("farm ", "bold"),
        (health.status, "bold green" if ok else "bold red"),
        f"  {url}  version {health.version}  ({checks})",
    )
    parts = [title, _database(overview)] if overview.database is not None else [title]
    return Group(*parts, _pools(overview), _backends(overview), _batches(overview))


def _database(overview: Overview) -> Text:
    """The connection budget against what PostgreSQL takes: red once the farm may open more."""
    db = overview.database
    assert db is not None
    over = db.budget > db.max_connections
    return Text.assemble(
        "database connections: ",
        (f"budget {db.budget}", "bold red" if over else "bold"),
        f" (its processes' pools at most), in use {db.in_use}, max_connections {db.max_connections}",
        (" - more than the server takes: lower the pools or put PgBouncer in front" if over else "", "red"),
    )


def _pools(overview: Overview) -> Table:
    table = Table(title="pools", title_justify="left", expand=False)
    for column in ("node", "stage", "processes", "slots", "queue", "waiting", "sandboxes"):
        table.add_column(
            column, justify="right" if column in {"processes", "slots", "waiting", "sandboxes"} else "left"
        )
    nodes = sorted({w.node for w in overview.workers} | {q.node for q in overview.queues if q.node})
    init_queue = next((q for q in overview.queues if q.stage is Stage.INIT), None)
    for node in nodes:
        for stage in STAGES:
            mine = [w for w in overview.workers if w.node == node and stage in w.stages]
            queue = (
                init_queue
                if stage is Stage.INIT
                else next((q for q in overview.queues if q.stage is stage and q.node == node), None)
            )
            table.add_row(
                node if stage is Stage.INIT else "",
                stage.value,
                str(len(mine)) if mine else Text("0", style="red"),
                str(sum(w.slots for w in mine)),
                queue.name if queue else "-",
                str(queue.length) if queue else "-",
                str(overview.sandboxes.get(node, 0)) if stage is Stage.INIT else "",
            )
    if not nodes:
        table.add_row("(no worker heard from)", "", "", "", "", "", "")
    return table


def _backends(overview: Overview) -> Table:
    # Capacity is a soft cap: the balancer gives a new job the backend with the lowest in flight /
    # capacity and never refuses one, so past it a backend queues the extra turns itself.
    over = any(b.inflight > b.capacity for b in overview.backends)
    caption = "capacity is a share, not a limit: jobs past it wait in the backend's own queue" if over else None
    table = Table(title="LLM backends", title_justify="left", caption=caption, caption_justify="left")
    for column in ("backend", "kind", "model", "load", "jobs (capacity)", "tokens/s", "healthy", "weights"):
        table.add_column(column, justify="right" if column == "tokens/s" else "left")
    for b in overview.backends:
        share = b.inflight / b.capacity if b.capacity else 0.0
        table.add_row(
            b.id,
            b.kind,
            b.model or "-",
            ProgressBar(total=1.0, completed=min(share, 1.0), width=20),
            jobs_on_backend(b.inflight, b.capacity),
            f"{b.tokens_per_s:.0f}" if b.tokens_per_s is not None else "-",
            Text("yes", style="green") if b.healthy else Text("no", style="red"),
            f"v{b.weight_version}",
        )
    if not overview.backends:
        table.add_row("(none registered)", "", "", "", "", "", "", "")
    return table


def jobs_on_backend(inflight: int, capacity: int) -> Text:
    """``12 (16)``; past the capacity ``20 (16, 4 queued)``: the backend holds them, nothing is lost."""
    if inflight <= capacity:
        return Text(f"{inflight} ({capacity})")
    return Text(f"{inflight} ({capacity}, {inflight - capacity} queued)", style="yellow")


def _batches(overview: Overview) -> Table:
    table = Table(title="running batches", title_justify="left")
    for column in ("batch", "progress", "finished", "in stages", "outcomes so far", "reward", "tokens/s", "time left"):
        table.add_column(column, justify="right" if column in {"reward", "tokens/s", "time left"} else "left")
    for b in overview.batches:
        counts = ", ".join(f"{s.value} {n}" for s, n in b.counts.items() if n and not s.terminal)
        outcomes = ", ".join(f"{o.value} {n}" for o, n in sorted(b.outcomes.items()) if n)
        table.add_row(
            str(b.id),
            ProgressBar(total=max(b.total_jobs, 1), completed=b.finished_jobs, width=24),
            f"{b.finished_jobs}/{b.total_jobs}",
            counts or "-",
            outcomes or "-",
            reward_text(b),
            f"{b.tokens_per_s:.0f}" if b.tokens_per_s is not None else "-",
            duration(b.eta_s) if b.eta_s is not None else "-",
        )
    if not overview.batches:
        table.add_row("(none)", "", "", "", "", "", "", "")
    return table


def reward_text(b: BatchStatus) -> str:
    """``0.42 (n=17)``: the mean over the scored jobs, and how many that is."""
    return f"{b.reward_mean:.2f} (n={b.scored})" if b.reward_mean is not None else "-"


def duration(seconds: float) -> str:
    """``45s``, ``12m05s``, ``3h20m``."""
    s = int(round(seconds))
    if s < 60:
        return f"{s}s"
    if s < 3600:
        return f"{s // 60}m{s % 60:02d}s"
    return f"{s // 3600}h{s % 3600 // 60:02d}m"


def batch_view(batch: BatchStatus) -> Table:
    """One batch as a reader wants it: its state, progress, jobs per state and outcomes."""
    table = Table(title=f"batch {batch.id}", title_justify="left", show_header=False, box=None)
    table.add_column("what", style="bold")
    table.add_column("value")
    finished = f" (finished {batch.finished_at:%Y-%m-%d %H:%M:%S} UTC)" if batch.finished_at else ""
    table.add_row("state", f"{batch.state.value}{finished}")
    table.add_row("created", f"{batch.created_at:%Y-%m-%d %H:%M:%S} UTC")
    table.add_row("jobs", f"{batch.finished_jobs}/{batch.total_jobs} finished (groups of {batch.group_size})")
    table.add_row("by state", ", ".join(f"{s.value} {n}" for s, n in batch.counts.items() if n) or "-")
    table.add_row("outcomes", ", ".join(f"{o.value} {n}" for o, n in sorted(batch.outcomes.items()) if n) or "-")
    table.add_row("reward", reward_text(batch) if batch.scored else "- (no job scored yet)")
    pace = f", {batch.tokens_per_s:.0f} tokens/s" if batch.tokens_per_s is not None else ""
    sampled = f"{batch.sampled_tokens} sampled tokens" if batch.sampled_tokens is not None else "tokens not known"
    table.add_row("tokens", f"{sampled}{pace}")
    running = (
        f"running for {duration(batch.elapsed_s)}" if batch.finished_at is None else f"took {duration(batch.elapsed_s)}"
    )
    table.add_row("time", running + (f", about {duration(batch.eta_s)} left" if batch.eta_s is not None else ""))
    table.add_row("history", batch.history)
    if batch.dynamic is not None:
        d = batch.dynamic
        table.add_row(
            "dynamic",
            f"{d.informative}/{d.target_groups} informative groups; {d.started} started of a pool of {d.pool}, "
            f"{d.running} running, {d.uninformative} uninformative, {d.failed} failed, {d.skipped} skipped"
            + (f"; ended: {d.end_reason}" if d.end_reason else ""),
        )
    if batch.metadata:
        table.add_row("metadata", ", ".join(f"{k}={v}" for k, v in batch.metadata.items()))
    return table
