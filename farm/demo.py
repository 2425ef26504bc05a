"""``farm demo``: the embedded stack, a batch of the four shipped task types end to end, then a short
closed RL loop that moves a reward, and the commands to run next.

The built-in backend serves the tiny random model: on math, code, swe and harbor it solves close to
nothing, so those rewards are about 0 and many episodes end on their turn budget (``agent_error``).
That part shows the pipeline, the sandboxes, the tools and the graders running for real. The loop
then shows learning: a few GRPO steps (``farm.learning``) on the ``generate`` vowels task, whose
shaped reward the tiny model moves within seconds a step; its reward before and after are printed.

Results (the tables, the reward before and after, the next commands) go to stdout, progress to
stderr. ``--keep`` leaves the stack up (with the trained weights served) for the next commands.
"""

from __future__ import annotations

import time
from typing import Any

from rich.console import Console

from farm.client import FarmClient
from farm.config import Settings
from farm.embedded import EmbeddedStack, token_file, token_hint
from farm.learning import ClosedLoop, LoopOptions
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
#: the closed loop's size: 4 x 8 rollouts a step and a learning rate that moves the mean reward
#: well past its noise within 3 steps (0.21 -> 0.45 measured; the example's 3e-3 takes ~10).
DEMO_LOOP = LoopOptions(steps=3, prompts=4, group=8, max_tokens=16, lr=2e-2)


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


def run_demo(
    settings: Settings,
    *,
    num_tasks: int,
    group_size: int,
    learn_steps: int,
    keep: bool,
    console: Console,
    out: Console,
) -> int:
    """Returns the process exit code: 0 when every job finished done (and the loop ran)."""
    stack = EmbeddedStack(settings, with_flower=False)
    started = time.monotonic()
    stack.start(report=lambda step: console.print(f"[dim]{time.monotonic() - started:5.1f}s[/] {step}"))
    try:
        s = stack.settings
        assert s.api.token is not None
        console.print(f"[green]stack up[/] in {time.monotonic() - started:.1f}s: API {s.api_url}, {token_hint(s)}")
        with FarmClient(s.api_url, token=s.api.token.get_secret_value(), timeout_s=120) as client:
            batch = client.submit(demo_tasks(num_tasks), group_size=group_size, sampling=DEMO_SAMPLING)
            console.print(f"batch {batch.id}: {len(batch.job_ids)} jobs of the four shipped task types")
            results = follow(client, batch.id, len(batch.job_ids), console=console)
            out.print(summary_table(summarize(results), title=f"demo batch {batch.id}: the pipeline"))
            out.print(
                "[dim]ok: the episode ran to its end and was scored; the reward says whether it solved the task. "
                "The tiny random model solves almost nothing here: rewards near 0 are expected.[/]"
            )
            failed = [r for r in results if r.job.state.value != "done"]
            for r in failed[:5]:
                out.print(f"[red]job {r.job.id} {r.job.state.value}: {r.job.reason}[/]")
            learned = _learn(client, stack, learn_steps, console=console, out=out) if learn_steps > 0 else True
        out.print(_next_steps(stack, batch.id, keep=keep))
        if keep:
            _wait_for_stop(stack, console)
        return 1 if failed or not learned else 0
    finally:
        with console.status("stopping the stack..."):
            stack.stop()


def _learn(client: FarmClient, stack: EmbeddedStack, steps: int, *, console: Console, out: Console) -> bool:
    """A few GRPO steps on the vowels task; prints the reward before and after. False: it failed."""
    s = stack.settings
    assert s.llm.builtin_model_dir is not None
    options = LoopOptions(**{**DEMO_LOOP.__dict__, "steps": steps})
    console.print(
        f"learning: {_steps(steps)} of GRPO, {options.prompts} x {options.group} rollouts each, on the vowels task "
        "(reward: the share of the reply that is vowels), new weights served after each"
    )
    loop = ClosedLoop(
        client, policy_dir=s.llm.builtin_model_dir, weights_dir=s.data_dir / "demo-weights", options=options
    )

    def said(step: dict[str, Any]) -> None:
        console.print(f"  step {step['step']}: reward {step['reward']:.3f}, weights v{loop.version} served")

    try:
        history = loop.run(said)
        after = loop.mean_reward(steps)
    except RuntimeError as exc:
        out.print(f"[red]the learning loop failed: {exc}[/]")
        return False
    before = float(history[0]["reward"])
    out.print(
        f"learning (GRPO, {_steps(steps)}, {options.prompts * options.group} rollouts each): mean reward "
        f"[bold]{before:.3f}[/] before -> [bold]{after:.3f}[/] after (weights v{loop.version})"
    )
    return True


def _steps(n: int) -> str:
    return f"{n} step" if n == 1 else f"{n} steps"


def _next_steps(stack: EmbeddedStack, batch_id: int, *, keep: bool) -> str:
    s = stack.settings
    if keep:
        commands = [
            ("farm status", "the farm at a glance (in another terminal: Ctrl-C here stops the stack)"),
            (f"farm status {batch_id} --json", "the demo batch, as the API answers it"),
            (f"farm report {batch_id}", "an HTML page and a PNG of the demo batch"),
            (f'curl -s -H "Authorization: Bearer $(cat {token_file(s)})" {s.api_url}/metrics', ""),
        ]
    else:
        commands = [
            ("farm demo --keep", "the same, leaving the stack up for farm status, farm report, /metrics"),
            ("farm up", "the stack alone, in the foreground"),
            ("farm submit tasks.jsonl", f"your own tasks (GET {s.api_url}/v1/tasks lists the shipped ones)"),
            ("python examples/grpo_cpu.py", "a longer GRPO run, with a reward plot"),
        ]
    width = max(len(c) for c, why in commands if why)
    lines = [f"  {c:<{width}}  # {why}" if why else f"  {c}" for c, why in commands]
    return "\n".join(["", "next:", *lines])


def _wait_for_stop(stack: EmbeddedStack, console: Console) -> None:
    console.print(f"[green]the stack stays up[/] (API {stack.settings.api_url}); Ctrl-C or SIGTERM stops it")
    if dead := stack.serve_until_stopped():
        console.print(f"[red]{dead.name} exited:[/]\n{stack.tail(dead)}")
