"""Agent episodes on the embedded stack: 64 mixed jobs (math, code, swe, harbor) end to end.

    python bench/episode.py [--tasks 16] [--group-size 4]

The stack is what `farm up` starts (its own Valkey, SQLite, API, one worker per stage, the
built-in backend serving the tiny model). The batch runs twice:

- ``tool-using agent``: the backend's scripted mode gives every episode a few real tool calls
  (pytest in the repository, reading files, running Python) before it answers or submits,
  as a capable model would; these figures are the ones in the last JSON line;
- ``random model``: the tiny model samples freely (it never writes a valid tool call, so its
  episodes are model time only); reported under ``random_model``.

Prints jobs per minute, the mean time of each stage, and where RUN's time goes: waiting on the
model, running tools, or the farm itself (inside the loop: prompt building and parsing; around
it: sandbox attach, taking the result out, the stage's bookkeeping).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from rich.console import Console  # noqa: E402

from bench._common import emit, free_port  # noqa: E402
from farm.agent.toolcalls import format_call  # noqa: E402
from farm.client import FarmClient  # noqa: E402
from farm.config import Settings  # noqa: E402
from farm.demo import DEMO_SAMPLING, demo_tasks  # noqa: E402
from farm.embedded import EmbeddedStack  # noqa: E402
from farm.progress import summarize, summary_table  # noqa: E402
from farm.schemas import JobResult  # noqa: E402

FENCE = "`" * 3


def _bash(command: str) -> str:
    return format_call("bash", {"command": command})


#: a tool-using agent per task type, keyed by text of that type's system prompt.
SCRIPT = {
    "rules": [
        {"match": "careful mathematician", "turns": ["Working it out: \\boxed{42}"]},
        {
            "match": "expert Python programmer working in",
            "turns": [
                _bash("python -c 'print(sorted([3, 1, 2]))'"),
                f"{FENCE}python\ndef solve(*args):\n    return None\n{FENCE}",
            ],
        },
        {
            "match": "fixing an issue in the repository",
            "turns": [
                _bash("git status --short && ls"),
                _bash("python -m pytest -q -x 2>&1 | tail -5"),
                format_call("editor", {"command": "view", "path": "README.md"}),
                format_call("submit", {}),
            ],
        },
        {
            "match": "expert at the Linux command line",
            "turns": [_bash("ls -la && pwd"), _bash("cat *.sh 2>/dev/null | head -20"), format_call("submit", {})],
        },
    ]
}


def run_batch(args: argparse.Namespace, *, scripted: bool) -> tuple[list[JobResult], float]:
    with tempfile.TemporaryDirectory(prefix="farm-bench-episode-") as tmp:
        llm: dict[str, Any] = {"builtin_port": free_port()}
        if scripted:
            script = Path(tmp) / "script.json"
            script.write_text(json.dumps(SCRIPT))
            llm["builtin_script"] = script
        settings = Settings(data_dir=Path(tmp), api={"token": "bench", "port": free_port()}, llm=llm)
        stack = EmbeddedStack(settings, with_flower=False)
        stack.start()
        try:
            with FarmClient(stack.settings.api_url, token="bench") as client:
                started = time.perf_counter()
                batch = client.submit(demo_tasks(args.tasks), group_size=args.group_size, sampling=DEMO_SAMPLING)
                results = list(client.results(batch.id, encoding="json"))
                return results, time.perf_counter() - started
        finally:
            stack.stop()


def figures(results: list[JobResult], elapsed: float, console: Console, title: str) -> dict[str, Any]:
    console.print(summary_table(summarize(results), title=f"{title}: {len(results)} jobs in {elapsed:.1f} s"))
    stage_s: dict[str, float] = {}
    for stage in ("init", "run", "eval"):
        values = [
            r.trajectory.timings[f"{stage}_s"] for r in results if r.trajectory and f"{stage}_s" in r.trajectory.timings
        ]
        stage_s[stage] = round(statistics.fmean(values), 3) if values else 0.0
    run_total = model = tools = in_episode = setup = collect = 0.0
    for r in results:
        if r.trajectory is None or "run_s" not in r.trajectory.timings:
            continue
        episode = r.trajectory.info.get("timings", {})
        run_total += r.trajectory.timings["run_s"]
        model += episode.get("model_s", 0.0)
        tools += episode.get("tools_s", 0.0)
        in_episode += episode.get("total_s", 0.0)
        setup += episode.get("setup_s", 0.0)
        collect += episode.get("collect_s", 0.0)
    share = {
        "tools": round(tools / run_total, 3),
        "model": round(model / run_total, 3),
        "farm": round(max(run_total - model - tools, 0.0) / run_total, 3),
    }
    around = max(run_total - in_episode, 0.0) / run_total
    failed = sum(1 for r in results if r.job.state.value != "done")
    console.print(
        f"jobs not done: {failed}; RUN time: model {share['model']:.1%}, tools {share['tools']:.1%}, "
        f"farm {share['farm']:.1%} ({share['farm'] - around:.1%} in the loop, {around:.1%} around it: "
        f"setup {setup / run_total:.1%}, collect {collect / run_total:.1%}, "
        f"stage {(run_total - in_episode - setup - collect) / run_total:.1%})\n"
    )
    return {
        "jobs": len(results),
        "jobs_per_min": round(len(results) / elapsed * 60, 1),
        "stage_s": stage_s,
        "run_share": share,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tasks", type=int, default=16)
    parser.add_argument("--group-size", type=int, default=4)
    args = parser.parse_args()
    console = Console(width=120)
    scripted = figures(*run_batch(args, scripted=True), console, "tool-using agent (scripted)")
    random_model = figures(*run_batch(args, scripted=False), console, "random tiny model")
    emit({**scripted, "random_model": random_model})


if __name__ == "__main__":
    main()
