"""``farm report BATCH``: one self-contained HTML page (figures inlined as SVG) and a PNG of a
batch as it ran.

The timeline is the point: each job is a lane with its INIT, RUN and EVAL as they executed (from
the stage durations the workers recorded, placed at the moment each stage completed), and under
it the number of jobs in each stage over time, where the three pools overlapping shows. Then
throughput, outcomes and the reward distribution per task type.

A stage's executing interval ends when the job moved on (``run_at`` for INIT, ``eval_at`` for
RUN, ``finished_at`` for EVAL) and lasted the recorded ``<stage>_s``; the gaps between are the
job waiting in the next queue. A job without recorded durations (failed before RUN ended, say)
is drawn from its state timestamps alone.
"""

from __future__ import annotations

import html
import io
from collections import Counter, defaultdict
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

from farm.constants import Outcome
from farm.deadlines.shares import seconds_to
from farm.schemas import BatchStatus, JobResult

if TYPE_CHECKING:
    from matplotlib.figure import Figure

    from farm.client import FarmClient

STAGE_COLOURS = {"init": "#4C78A8", "run": "#F58518", "eval": "#54A24B"}
OUTCOME_COLOURS = {
    "ok": "#54A24B",
    "agent_error": "#ECA82C",
    "timeout": "#B279A2",
    "handler_error": "#E45756",
    "infra_error": "#9D755D",
    "cancelled": "#BAB0AC",
}


@dataclass(frozen=True)
class JobSpan:
    """One job's executing intervals, in seconds since the batch was created."""

    job_id: int
    type: str
    outcome: str
    reward: float | None
    stages: dict[str, tuple[float, float]]
    finished: float | None


def job_spans(status: BatchStatus, results: list[JobResult]) -> list[JobSpan]:
    origin = status.created_at

    def at(moment: datetime | None) -> float | None:
        return None if moment is None else (moment - origin).total_seconds()

    spans = []
    for r in sorted(results, key=lambda r: r.job.id):
        job = r.job
        timings = r.trajectory.timings if r.trajectory is not None else {}
        ends = {"init": at(job.run_at), "run": at(job.eval_at), "eval": at(job.finished_at)}
        starts = {"init": at(job.init_at), "run": at(job.run_at), "eval": at(job.eval_at)}
        stages = {}
        for stage in ("init", "run", "eval"):
            end, start = ends[stage], starts[stage]
            if end is None or start is None:
                continue
            if (took := timings.get(f"{stage}_s")) is not None:
                start = max(start, end - took)
            stages[stage] = (start, max(end, start))
        outcome = job.outcome.value if job.outcome is not None else job.state.value
        spans.append(JobSpan(job.id, job.type, outcome, job.reward, stages, at(job.finished_at)))
    return spans


def fetch_results(client: FarmClient, batch_id: int) -> list[JobResult]:
    """Every job of the batch finished so far (a running batch is drawn as far as it got)."""
    results: list[JobResult] = []
    cursor = 0
    while True:
        page = client.results_page(batch_id, after=cursor, wait_s=0, encoding="b64")
        results += page.items
        if not page.items or page.next_cursor == cursor:
            return results
        cursor = page.next_cursor


def render(status: BatchStatus, results: list[JobResult], *, html_path: Path, png_path: Path | None) -> None:
    """Write the page (and the PNG, when asked) for a batch's results."""
    spans = job_spans(status, results)
    # What has time on its x axis is one figure the page's width (lanes, load and throughput line
    # up); the two per-task-type figures share the next row, half the width each.
    figures = {
        "timeline": _alone(lambda *axes: _over_time(spans, *axes), size=(11, 8.5), ratios=TIME_RATIOS),
        "outcomes": _alone(lambda ax: _outcomes(spans, ax), size=HALF_SIZE),
        "rewards": _alone(lambda ax: _rewards(spans, ax), size=HALF_SIZE),
    }
    svgs = {name: _svg(fig) for name, fig in figures.items()}
    html_path.write_text(_page(status, spans, svgs, _tail(status, results)))
    if png_path is not None:
        _combined(spans).savefig(png_path, dpi=110)


#: heights of the time figure's panels: job lanes, jobs per stage, jobs finished.
TIME_RATIOS = [3.0, 1.3, 1.3]
#: inches of a figure that takes half the page's width.
HALF_SIZE = (6.2, 4.2)


def _over_time(spans: list[JobSpan], ax_lanes: Any, ax_load: Any, ax_finished: Any) -> None:
    _timeline(spans, ax_lanes, ax_load)
    ax_load.set_xlabel("")
    _throughput(spans, ax_finished)


def _plt() -> Any:
    import matplotlib

    matplotlib.use("Agg")  # no display: files only
    import matplotlib.pyplot as plt

    return plt


def _timeline(spans: list[JobSpan], ax_lanes: Any, ax_load: Any) -> None:
    plt = _plt()
    for lane, span in enumerate(spans):
        for stage, (start, end) in span.stages.items():
            ax_lanes.broken_barh([(start, max(end - start, 1e-3))], (lane - 0.4, 0.8), color=STAGE_COLOURS[stage])
    ax_lanes.set_ylabel("job (in id order)")
    ax_lanes.set_ylim(-1, max(len(spans), 1))
    ax_lanes.set_title("each job's INIT, RUN and EVAL as they ran (gaps: waiting in the next queue)")
    handles = [plt.Rectangle((0, 0), 1, 1, color=c) for c in STAGE_COLOURS.values()]
    ax_lanes.legend(
        handles,
        [s.upper() for s in STAGE_COLOURS],
        loc="upper left",
        bbox_to_anchor=(1.01, 1.0),
        borderaxespad=0,
        fontsize="small",
    )
    times, load = _stage_load(spans)
    for stage, colour in STAGE_COLOURS.items():
        ax_load.step(times, load[stage], where="post", color=colour, label=stage.upper())
    ax_load.set_ylabel("jobs in stage")
    ax_load.set_xlabel("seconds since the batch was submitted")
    ax_load.set_title("the three pools at work at once")
    ax_load.legend(loc="upper left", bbox_to_anchor=(1.01, 1.0), borderaxespad=0, fontsize="small")


def _stage_load(spans: list[JobSpan]) -> tuple[list[float], dict[str, list[int]]]:
    """How many jobs were executing each stage, as a step function over every start and end."""
    events: list[tuple[float, str, int]] = []
    for span in spans:
        for stage, (start, end) in span.stages.items():
            events += [(start, stage, 1), (end, stage, -1)]
    events.sort(key=lambda e: (e[0], e[2]))  # an end before a start at the same moment
    times: list[float] = [0.0]
    load = {stage: [0] for stage in STAGE_COLOURS}
    current = dict.fromkeys(STAGE_COLOURS, 0)
    for moment, stage, delta in events:
        current[stage] += delta
        times.append(moment)
        for s in STAGE_COLOURS:
            load[s].append(current[s])
    return times, load


def _throughput(spans: list[JobSpan], ax: Any) -> None:
    finished = sorted(s.finished for s in spans if s.finished is not None)
    ax.step([0.0, *finished], range(len(finished) + 1), where="post", color="#4C78A8")
    ax.set_xlim(left=0)
    ax.set_xlabel("seconds since the batch was submitted")
    ax.set_ylabel("jobs finished")
    rate = len(finished) / finished[-1] if finished and finished[-1] > 0 else 0.0
    ax.set_title(f"throughput: {rate:.2f} jobs/s overall")


def _outcomes(spans: list[JobSpan], ax: Any) -> None:
    types = sorted({s.type for s in spans})
    counts = {t: Counter(s.outcome for s in spans if s.type == t) for t in types}
    outcomes = sorted({o for c in counts.values() for o in c}, key=lambda o: (o != "ok", o))
    bottom = [0] * len(types)
    for outcome in outcomes:
        heights = [counts[t][outcome] for t in types]
        ax.bar(types, heights, bottom=bottom, label=outcome, color=OUTCOME_COLOURS.get(outcome, "#888888"))
        bottom = [b + h for b, h in zip(bottom, heights, strict=True)]
    ax.set_ylabel("jobs")
    ax.set_title("how episodes ended, per task type")
    if outcomes:
        # Beside the axes, never over a bar.
        ax.legend(fontsize="small", loc="upper left", bbox_to_anchor=(1.01, 1.0), borderaxespad=0)


def _rewards(spans: list[JobSpan], ax: Any) -> None:
    by_type: dict[str, list[float]] = defaultdict(list)
    for s in spans:
        if s.reward is not None:
            by_type[s.type].append(s.reward)
    types = sorted(by_type)
    if types:
        ax.boxplot([by_type[t] for t in types], tick_labels=types, showmeans=True)
        for i, t in enumerate(types, start=1):  # every reward, so a few jobs are not hidden by a box
            xs = [i + 0.15 * ((j % 7) - 3) / 3 for j in range(len(by_type[t]))]
            ax.scatter(xs, by_type[t], s=8, alpha=0.5, color="#4C78A8")
    ax.set_ylabel("reward")
    ax.set_title("reward distribution per task type")


def _alone(
    draw: Callable[..., None], *, size: tuple[float, float] = (5.5, 3.6), ratios: list[float] | None = None
) -> Figure:
    """A figure of its own for one drawing (one axes, or a column of ``len(ratios)`` sharing x)."""
    rows = len(ratios) if ratios else 1
    fig, axes = _plt().subplots(rows, 1, figsize=size, sharex=True, gridspec_kw={"height_ratios": ratios or [1]})
    if rows > 1:
        draw(*axes)
    else:
        draw(axes)
    fig.tight_layout()
    figure: Figure = fig
    return figure


def _combined(spans: list[JobSpan]) -> Figure:
    plt = _plt()
    fig = plt.figure(figsize=(13, 14))
    grid = fig.add_gridspec(4, 2, height_ratios=[*TIME_RATIOS, 2.6])
    lanes = fig.add_subplot(grid[0, :])
    _over_time(spans, lanes, fig.add_subplot(grid[1, :], sharex=lanes), fig.add_subplot(grid[2, :], sharex=lanes))
    _outcomes(spans, fig.add_subplot(grid[3, 0]))
    _rewards(spans, fig.add_subplot(grid[3, 1]))
    fig.tight_layout()
    figure: Figure = fig
    return figure


def _svg(fig: Figure) -> str:
    buffer = io.StringIO()
    fig.savefig(buffer, format="svg")
    _plt().close(fig)
    text = buffer.getvalue()
    return text[text.index("<svg") :]  # the XML prologue has no place inside HTML


def _tail(status: BatchStatus, results: list[JobResult]) -> str:
    """Time to 50/90/99/100% of the batch (cut jobs do not count as done), and its readiness."""
    finished = [
        r.job.finished_at for r in results if r.job.finished_at is not None and r.job.outcome is not Outcome.CANCELLED
    ]
    figures = seconds_to(status.created_at, finished, status.total_jobs)
    cells = "".join(
        f"<tr><td>{html.escape(share)}</td><td>{'-' if s is None else f'{s:.1f}'}</td></tr>"
        for share, s in figures.items()
    )
    ready = ""
    if (r := status.readiness) is not None:
        said = f"ready ({r.reason}) at result {r.ready_seq}" if r.ready else "not ready yet"
        ready = f'<p id="readiness">quorum {r.needed} jobs, rest {r.rest}: {said}; carried {r.carried}, cut {r.cut}</p>'
    return f'<h2>Tail</h2><table id="tail"><tr><th>share done</th><th>seconds</th></tr>{cells}</table>{ready}'


def _page(status: BatchStatus, spans: list[JobSpan], svgs: dict[str, str], tail: str = "") -> str:
    rows = []
    for task_type in sorted({s.type for s in spans}):
        mine = [s for s in spans if s.type == task_type]
        rewards = [s.reward for s in mine if s.reward is not None]
        mean = f"{sum(rewards) / len(rewards):.3f}" if rewards else "-"
        outcomes = ", ".join(f"{o} {n}" for o, n in sorted(Counter(s.outcome for s in mine).items()))
        durations = {
            stage: [e - b for s in mine if (span := s.stages.get(stage)) for b, e in [span]] for stage in STAGE_COLOURS
        }
        cells = [task_type, str(len(mine)), outcomes, mean]
        cells += [f"{sum(d) / len(d):.2f}" if d else "-" for d in durations.values()]
        rows.append("<tr>" + "".join(f"<td>{html.escape(c)}</td>" for c in cells) + "</tr>")
    header = "".join(
        f"<th>{h}</th>"
        for h in ("task type", "jobs", "outcomes", "mean reward", "INIT s (mean)", "RUN s (mean)", "EVAL s (mean)")
    )
    title = f"rollout-farm batch {status.id}"
    counts = ", ".join(f"{k} {v}" for k, v in sorted(status.counts.items()) if v)
    return f"""<!doctype html>
<html lang="en"><head><meta charset="utf-8"><title>{html.escape(title)}</title>
<style>
body {{ font-family: system-ui, sans-serif; margin: 2em auto; max-width: 1150px; color: #222; }}
table {{ border-collapse: collapse; margin: 1em 0; }}
td, th {{ border: 1px solid #ccc; padding: 4px 10px; text-align: left; }}
figure {{ margin: 1em 0; }}
.pair {{ display: grid; grid-template-columns: 1fr 1fr; gap: 1.5em; }}
@media (max-width: 800px) {{ .pair {{ grid-template-columns: 1fr; }} }}
svg {{ width: 100%; height: auto; }}
</style></head><body>
<h1>{html.escape(title)}</h1>
<p id="summary">state <b>{html.escape(status.state.value)}</b>; {len(spans)} jobs ({html.escape(counts)});
submitted {html.escape(status.created_at.isoformat(timespec="seconds"))}</p>
<table id="per-type"><tr>{header}</tr>{"".join(rows)}</table>
{tail}
<h2>Pipeline</h2><figure id="timeline">{svgs["timeline"]}</figure>
<h2>Outcomes and rewards</h2>
<div class="pair">
<figure id="outcomes">{svgs["outcomes"]}</figure>
<figure id="rewards">{svgs["rewards"]}</figure>
</div>
<p><small>Made by <code>farm report</code>; every figure is inline, the page needs nothing else.</small></p>
</body></html>
"""
