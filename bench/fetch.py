"""Trajectories from the API into padded client arrays: tokens per second.

    python bench/fetch.py [--trajectories 256] [--min-tokens 4096] [--max-tokens 32768]

Finished jobs with random trajectories are written straight into a fresh PostgreSQL database;
then the API (a real `farm api` process) serves them through the results stream to
``FarmClient.results`` and ``to_arrays``, as a trainer reads a finished batch.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
from sqlalchemy import insert, update

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench._common import emit, flushed_redis, fresh_database, stack_settings  # noqa: E402
from farm.client import FarmClient, to_arrays  # noqa: E402
from farm.config import Settings  # noqa: E402
from farm.constants import BatchState, JobState, Outcome  # noqa: E402
from farm.db import queries  # noqa: E402
from farm.db.arrays import pack_ids, pack_logprobs, pack_mask  # noqa: E402
from farm.db.base import utcnow  # noqa: E402
from farm.db.models import Batch, Job, Trajectory  # noqa: E402
from farm.db.session import make_engine, make_session_factory, transaction  # noqa: E402
from farm.embedded import embedded  # noqa: E402
from farm.schemas import BatchCreate  # noqa: E402


def seed_batch(url: str, count: int, lo: int, hi: int) -> tuple[int, int]:
    """A finished batch of ``count`` jobs with random trajectories; returns (batch id, tokens)."""
    rng = np.random.default_rng(0)
    engine = make_engine(Settings(), url=url)
    sessions = make_session_factory(engine)
    request = BatchCreate(tasks=[{"type": "echo", "config": {"text": "x"}}] * count)
    now = utcnow()
    total = 0
    with transaction(sessions) as session:
        batch, job_ids = queries.create_batch(
            session, request, idempotency_key=None, digest="bench", now=now, owed_until=now
        )
        for seq, job_id in enumerate(job_ids, start=1):
            n = int(rng.integers(lo, hi + 1))
            total += n
            prompt = n // 4
            mask = np.r_[np.zeros(prompt, np.uint8), np.ones(n - prompt, np.uint8)]
            session.execute(
                insert(Trajectory).values(
                    job_id=job_id,
                    num_tokens=n,
                    token_ids=pack_ids(rng.integers(0, 32000, n)),
                    logprobs=pack_logprobs(-rng.random(n, dtype=np.float32) * mask),
                    loss_mask=pack_mask(mask),
                    turn_offsets=pack_ids([0, prompt]),
                    reward=float(rng.random()),
                    metrics={},
                    timings={},
                    info={},
                    created_at=now,
                )
            )
            session.execute(
                update(Job)
                .where(Job.id == job_id)
                .values(
                    state=JobState.DONE,
                    outcome=Outcome.OK,
                    finish_seq=seq,
                    finished_at=now,
                    stage_done=True,
                )
            )
        session.execute(
            update(Batch)
            .where(Batch.id == batch.id)
            .values(
                finished_jobs=count,
                state=BatchState.COMPLETE,
                finished_at=now,
                enqueued_at=now,
            )
        )
        batch_id = batch.id
    engine.dispose()
    return batch_id, total


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--trajectories", type=int, default=256)
    parser.add_argument("--min-tokens", type=int, default=4096)
    parser.add_argument("--max-tokens", type=int, default=32768)
    parser.add_argument("--page-size", type=int, default=32)
    args = parser.parse_args()
    with fresh_database() as db, flushed_redis() as url, tempfile.TemporaryDirectory() as tmp:
        batch_id, tokens = seed_batch(db, args.trajectories, args.min_tokens, args.max_tokens)
        settings = stack_settings(Path(tmp), redis_url=url, database_url=db, concurrency={})
        with embedded(settings, with_flower=False, stages=()) as stack:
            with FarmClient(stack.settings.api_url, token="bench", timeout_s=120) as client:
                best = 0.0
                for _ in range(3):
                    started = time.perf_counter()
                    trajs = [r.trajectory for r in client.results(batch_id, page_size=args.page_size, wait_s=0)]
                    arrays = to_arrays(trajs)
                    elapsed = time.perf_counter() - started
                    assert int(arrays["attention_mask"].sum()) == tokens
                    rate = tokens / elapsed
                    best = max(best, rate)
                    print(
                        f"{len(trajs)} trajectories, {tokens / 1e6:.2f} M tokens in {elapsed:.3f} s: "
                        f"{rate / 1e6:.2f} M tokens/s"
                    )
    print(f"best of 3: {best / 1e6:.2f} M tokens/s (target >= 5)")
    emit({"tokens_per_s": round(best)})


if __name__ == "__main__":
    main()
