"""``farm report``'s figures are laid out for a reader: no legend over a bar, time figures stacked on
one x axis, the per-task-type figures side by side (the page itself is checked in a real browser by
tests/integration/test_cli.py)."""

from __future__ import annotations

from farm import report


def _spans() -> list[report.JobSpan]:
    outcomes = ["ok", "ok", "agent_error", "timeout", "ok", "ok", "ok", "infra_error"]
    return [
        report.JobSpan(
            i,
            ["math", "code", "swe", "harbor"][i % 4],
            outcomes[i % len(outcomes)],
            1.0 if i % 3 == 0 else 0.0,
            {"init": (i * 0.1, i * 0.1 + 0.5), "run": (i * 0.1 + 0.5, i * 0.1 + 3), "eval": (i * 0.1 + 3, i * 0.1 + 4)},
            i * 0.1 + 4,
        )
        for i in range(24)
    ]


def test_report_outcome_legend_covers_no_bar():
    fig = report._alone(lambda ax: report._outcomes(_spans(), ax), size=report.HALF_SIZE)
    fig.canvas.draw()
    (ax,) = fig.axes
    legend = ax.get_legend()
    assert legend is not None
    box = legend.get_window_extent()
    bars = [patch.get_window_extent() for patch in ax.patches if patch.get_window_extent().height > 0]
    assert bars and not any(box.overlaps(bar) for bar in bars)
    # ... and stays inside the figure, so the SVG shows it whole.
    assert fig.bbox.contains(box.x1 - 1, box.y1 - 1)


def test_report_time_legends_cover_no_lane():
    fig = report._alone(lambda *axes: report._over_time(_spans(), *axes), size=(11, 8.5), ratios=report.TIME_RATIOS)
    fig.canvas.draw()
    lanes, load, finished = fig.axes
    for ax in (lanes, load):
        legend = ax.get_legend()
        assert legend is not None and not legend.get_window_extent().overlaps(ax.get_window_extent())
    # One x axis for everything over time: lanes, the pools' load and the jobs finished line up.
    assert lanes.get_xlim() == load.get_xlim() == finished.get_xlim()


def test_report_png_puts_the_per_type_figures_side_by_side():
    fig = report._combined(_spans())
    fig.canvas.draw()
    lanes, load, finished, outcomes, rewards = (ax.get_window_extent() for ax in fig.axes)
    assert lanes.width > 0.8 * fig.bbox.width  # the timeline spans the page
    assert outcomes.y1 < finished.y0 and abs(outcomes.y0 - rewards.y0) < 1  # one row under the time figures
    assert outcomes.x1 < rewards.x0 and min(outcomes.width, rewards.width) > 0.3 * fig.bbox.width
