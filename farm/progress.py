"""Watching a batch from a terminal: a rich progress bar fed by the results stream, and a
closing table per task type. Used by ``farm submit`` and ``farm demo``."""

from __future__ import annotations

import json
import statistics
from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import IO

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from farm.client import FarmClient
from farm.schemas import JobResult


@dataclass
class TypeSummary:
    jobs: int = 0
    outcomes: dict[str, int] = field(default_factory=lambda: defaultdict(int))
    rewards: list[float] = field(default_factory=list)
    tokens: list[int] = field(default_factory=list)
    turns: list[int] = field(default_factory=list)
    stage_s: dict[str, list[float]] = field(default_factory=lambda: defaultdict(list))


def summarize(results: Iterable[JobResult]) -> dict[str, TypeSummary]:
    out: dict[str, TypeSummary] = defaultdict(TypeSummary)
    for r in results:
        s = out[r.job.type]
        s.jobs += 1
        s.outcomes[r.job.outcome.value if r.job.outcome else r.job.state.value] += 1
        if r.trajectory is not None:
            if r.trajectory.reward is not None:
                s.rewards.append(r.trajectory.reward)
            s.tokens.append(r.trajectory.num_tokens)
            turns = r.trajectory.info.get("turns")  # the agent loop counts model turns
            s.turns.append(turns if isinstance(turns, int) else len(r.trajectory.turn_offsets) // 2)
            for key in ("init_s", "run_s", "eval_s"):
                if key in r.trajectory.timings:
                    s.stage_s[key].append(r.trajectory.timings[key])
    return dict(out)


def _mean(values: list[float] | list[int]) -> str:
    return f"{statistics.fmean(values):.2f}" if values else "-"


def summary_table(summaries: dict[str, TypeSummary], *, title: str) -> Table:
    table = Table(title=title)
    # How an episode ended and what it earned are two columns: "ok" is an episode that ran to its
    # end and was scored, whatever its reward.
    columns = ("task type", "jobs", "how episodes ended", "mean reward", "reward > 0")
    for col in (*columns, "turns", "tokens", "init s", "run s", "eval s"):
        table.add_column(col, justify="left" if col in ("task type", "how episodes ended") else "right")
    for name, s in sorted(summaries.items()):
        outcomes = ", ".join(f"{k} {v}" for k, v in sorted(s.outcomes.items()))
        table.add_row(
            name,
            str(s.jobs),
            outcomes,
            _mean(s.rewards),
            f"{sum(r > 0 for r in s.rewards)}/{len(s.rewards)}" if s.rewards else "-",
            _mean(s.turns),
            _mean(s.tokens),
            _mean(s.stage_s["init_s"]),
            _mean(s.stage_s["run_s"]),
            _mean(s.stage_s["eval_s"]),
        )
    return table


def follow(
    client: FarmClient, batch_id: int, total: int, *, console: Console, out: IO[str] | None = None
) -> list[JobResult]:
    """Stream a batch's results with a progress bar; optionally write each as a JSON line."""
    results: list[JobResult] = []
    columns = (
        TextColumn("[bold]batch {task.fields[batch]}"),
        BarColumn(),
        MofNCompleteColumn(),
        TextColumn("mean reward {task.fields[reward]}"),
        TimeElapsedColumn(),
    )
    with Progress(*columns, console=console, transient=False) as progress:
        task = progress.add_task("jobs", total=total, batch=batch_id, reward="-")
        for result in client.results(batch_id, encoding="json" if out else "b64"):
            results.append(result)
            if out is not None:
                out.write(json.dumps(result.model_dump(mode="json")) + "\n")
            rewards = [r.trajectory.reward for r in results if r.trajectory and r.trajectory.reward is not None]
            progress.update(task, advance=1, reward=_mean(rewards))
    return results
