"""``farm demo``: the embedded stack, one batch of all four task types end to end, a closing table.

The built-in backend serves the tiny random model, so the rewards are mostly 0 and many episodes
end on their turn budget (``agent_error``): the point is the pipeline, the sandboxes, the tools
and the scoring running for real. Point ``farm up`` at a real model to see rewards move.
"""

from __future__ import annotations

import time
from typing import Any

from rich.console import Console

from farm.client import FarmClient
from farm.config import Settings
from farm.embedded import EmbeddedStack, token_hint
from farm.progress import follow, summarize, summary_table

#: per task type: its share of the batch and the episode budget the tiny model gets.
DEMO_MIX: dict[str, tuple[int, dict[str, Any]]] = {
    "math": (3, {"max_turns": 1}),
    "code": (2, {"max_turns": 3}),
    "swe": (2, {"max_turns": 4}),
    "harbor": (1, {"max_turns": 4}),
}
#: short turns: the tiny model's replies are noise, and its context is 2048 tokens.
DEMO_SAMPLING = {"seed": 0, "temperature": 1.0, "max_tokens": 48}


def _sample(task_type: str, n: int) -> list[dict[str, Any]]:
    from tasks.code.dataset import sample_configs as code
    from tasks.harbor.dataset import sample_configs as harbor
    from tasks.math.dataset import sample_configs as math
    from tasks.swe.dataset import sample_configs as swe

    samplers = {"math": math, "code": code, "swe": swe, "harbor": harbor}
    configs = samplers[task_type](n, seed=0)
    return [configs[i % len(configs)] for i in range(n)]  # a family with fewer items repeats them


def demo_tasks(num_tasks: int) -> list[dict[str, Any]]:
    """A mixed batch of the four shipped task types, in the proportions of ``DEMO_MIX``."""
    total_share = sum(share for share, _ in DEMO_MIX.values())
    counts = {t: max(1, num_tasks * share // total_share) for t, (share, _) in DEMO_MIX.items()}
    counts["math"] += max(0, num_tasks - sum(counts.values()))
    tasks = []
    for task_type, (_, budget) in DEMO_MIX.items():
        for i, config in enumerate(_sample(task_type, counts[task_type])):
            tasks.append({"type": task_type, "config": {**config, **budget}, "name": f"demo-{task_type}-{i}"})
    return tasks


def run_demo(settings: Settings, *, num_tasks: int, group_size: int, console: Console) -> int:
    """Returns the process exit code: 0 when every job finished done."""
    stack = EmbeddedStack(settings, with_flower=False)
    started = time.monotonic()
    stack.start(report=lambda step: console.print(f"[dim]{time.monotonic() - started:5.1f}s[/] {step}"))
    try:
        s = stack.settings
        assert s.api.token is not None
        console.print(f"[green]stack up[/] in {time.monotonic() - started:.1f}s: API {s.api_url}, {token_hint(s)}")
        with FarmClient(s.api_url, token=s.api.token.get_secret_value()) as client:
            batch = client.submit(demo_tasks(num_tasks), group_size=group_size, sampling=DEMO_SAMPLING)
            console.print(f"batch {batch.id}: {len(batch.job_ids)} jobs on {s.api_url}")
            results = follow(client, batch.id, len(batch.job_ids), console=console)
        console.print(summary_table(summarize(results), title=f"demo batch {batch.id}"))
        failed = [r for r in results if r.job.state.value != "done"]
        for r in failed[:5]:
            console.print(f"[red]job {r.job.id} {r.job.state.value}: {r.job.reason}[/]")
        return 1 if failed else 0
    finally:
        with console.status("stopping the stack..."):
            stack.stop()
