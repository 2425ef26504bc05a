"""Why the farm decouples stages, measured: each stage holds its own capped resource.

    python bench/pipeline.py [--jobs 120]

Stage costs are simulated by the echo handler holding the stage for a fixed time: INIT 0.1 s
(at most 4 concurrent sandbox starts), RUN 0.5 s of waiting on the model (up to 32 concurrent),
EVAL 0.15 s (at most 2 concurrent: the cores). The farm runs one worker pool per stage, sized
by those caps. The coupled baseline runs the same handler's three stages back to back per job
with as many slots as the smallest cap (2), since more would break that cap. The bound is the
bottleneck stage's work divided by its cap.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench._common import emit, flushed_redis, fresh_database, stack_settings  # noqa: E402
from farm.client import FarmClient  # noqa: E402
from farm.constants import Stage  # noqa: E402
from farm.embedded import embedded  # noqa: E402
from farm.handlers.base import StageContext  # noqa: E402
from farm.handlers.echo import EchoHandler  # noqa: E402
from farm.schemas import SamplingParams  # noqa: E402

STAGE_S = {"init": 0.1, "run": 0.5, "eval": 0.15}
CAPS = {"init": 4, "run": 32, "eval": 2}
CONFIG: dict[str, Any] = {"text": "pipeline", "sleep_s": STAGE_S}
TASK = {"type": "echo", "config": CONFIG}


def farm_makespan(jobs: int) -> float:
    with fresh_database() as db, flushed_redis() as url, tempfile.TemporaryDirectory() as tmp:
        settings = stack_settings(Path(tmp), redis_url=url, database_url=db, concurrency=CAPS)
        with (
            embedded(settings, with_flower=False, with_llm=False) as stack,
            FarmClient(stack.settings.api_url, token="bench") as client,
        ):
            warm = client.submit([{"type": "echo", "config": {"text": "warm"}}] * 4)
            client.wait(warm.id, timeout_s=60, poll_s=0.05)
            started = time.perf_counter()
            batch = client.submit([TASK] * jobs)
            done = sum(
                1 for r in client.results(batch.id, page_size=500, trajectories=False) if r.job.state.value == "done"
            )
            elapsed = time.perf_counter() - started
            assert done == jobs, f"only {done}/{jobs} jobs finished done"
            return elapsed


def coupled_makespan(jobs: int) -> float:
    handler = EchoHandler()
    config = handler.validate(CONFIG)

    def ctx(stage: Stage) -> StageContext:
        return StageContext(
            job_id=0,
            batch_id=0,
            stage=stage,
            attempt=1,
            node="bench",
            sampling=SamplingParams(),
            seed=0,
            deadline=time.monotonic() + 60,
        )

    async def stages() -> float:
        state = await handler.init(config, ctx(Stage.INIT))
        result = await handler.run(config, state, ctx(Stage.RUN))
        return (await handler.evaluate(config, state.updated(result.state), result.trajectory, ctx(Stage.EVAL))).reward

    def one_job(_: int) -> float:
        return asyncio.run(stages())

    slots = min(CAPS.values())
    started = time.perf_counter()
    with ThreadPoolExecutor(max_workers=slots) as pool:
        rewards = list(pool.map(one_job, range(jobs)))
    assert len(rewards) == jobs
    return time.perf_counter() - started


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--jobs", type=int, default=120)
    args = parser.parse_args()
    bound = max(args.jobs * STAGE_S[s] / CAPS[s] for s in STAGE_S)
    farm = farm_makespan(args.jobs)
    print(
        f"farm makespan:    {farm:6.2f} s   ({args.jobs} jobs, pools init={CAPS['init']} run={CAPS['run']} "
        f"eval={CAPS['eval']})"
    )
    print(f"bottleneck bound: {bound:6.2f} s   (farm/bound {farm / bound:.3f}, target <= 1.15)")
    coupled = coupled_makespan(args.jobs)
    print(
        f"coupled makespan: {coupled:6.2f} s   ({min(CAPS.values())} slots; farm is {coupled / farm:.2f}x faster, "
        "target >= 3)"
    )
    emit(
        {
            "makespan_s": round(farm, 3),
            "bound_s": round(bound, 3),
            "coupled_s": round(coupled, 3),
            "bound_ratio": round(farm / bound, 3),
            "speedup_vs_coupled": round(coupled / farm, 2),
        }
    )


if __name__ == "__main__":
    main()
