"""Trajectories from the API into padded client arrays: tokens per second.

    python bench/fetch.py [--trajectories 256] [--min-tokens 4096] [--max-tokens 32768] [--rounds 5]

Finished jobs with random trajectories are written straight into a fresh PostgreSQL database;
then the API (a real `farm api` process) serves them through the results stream to
``FarmClient.results`` and ``to_arrays``, as a trainer reads a finished batch.

Its floor, measured in the same run and alternated with it: the same trajectories' stored
bytes (token ids, logprobs, loss mask) read straight from PostgreSQL with psycopg into NumPy
arrays (``np.frombuffer``), no API. Each round reads both ways, one after the other;
``ratio_to_raw`` is the median over ``--rounds`` of a round's API tokens/s over its raw read's
(target >= 0.5), and each side's tokens/s is its median. ``--warmup`` rounds before them are not
counted: a fresh stack's first reads pay for memory it has not touched yet and its first full
garbage collections, which a trainer reading batch after batch pays once.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import psycopg
from sqlalchemy import insert, update

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench._common import emit, flushed_redis, fresh_database, stack_settings  # noqa: E402
from farm.client import FarmClient, to_arrays  # noqa: E402
from farm.config import Settings  # noqa: E402
from farm.constants import BatchState, JobState, Outcome  # noqa: E402
from farm.db import batches  # noqa: E402
from farm.db.arrays import FLOAT32, INT32, UINT8, pack_ids, pack_logprobs, pack_mask  # noqa: E402
from farm.db.base import utcnow  # noqa: E402
from farm.db.models import Batch, Job, Trajectory  # noqa: E402
from farm.db.session import (  # noqa: E402
    libpq_url,  # noqa: E402
    make_engine,
    make_session_factory,
    transaction,
)
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
        batch, job_ids = batches.create_batch(
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


def raw_read(url: str, batch_id: int) -> int:
    """The floor: every trajectory of the batch, its three stored columns into NumPy; returns tokens."""
    tokens = 0
    with psycopg.connect(libpq_url(url)) as conn, conn.cursor(binary=True) as cursor:
        # Binary results: bytea arrives as its bytes (in text format it would arrive hex-encoded).
        rows = cursor.execute(
            "SELECT t.token_ids, t.logprobs, t.loss_mask FROM trajectories t JOIN jobs j ON j.id = t.job_id"
            " WHERE j.batch_id = %s ORDER BY j.finish_seq",
            (batch_id,),
        )
        for ids, logprobs, mask in rows:
            arrays = np.frombuffer(ids, INT32), np.frombuffer(logprobs, FLOAT32), np.frombuffer(mask, UINT8)
            tokens += len(arrays[0])
    return tokens


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--trajectories", type=int, default=256)
    parser.add_argument("--min-tokens", type=int, default=4096)
    parser.add_argument("--max-tokens", type=int, default=32768)
    parser.add_argument("--page-size", type=int, default=32)
    parser.add_argument("--rounds", type=int, default=5, help="rounds counted (the median is reported)")
    parser.add_argument("--warmup", type=int, default=2, help="rounds read first and not counted")
    args = parser.parse_args()
    with fresh_database() as db, flushed_redis() as url, tempfile.TemporaryDirectory() as tmp:
        batch_id, tokens = seed_batch(db, args.trajectories, args.min_tokens, args.max_tokens)
        settings = stack_settings(Path(tmp), redis_url=url, database_url=db, concurrency={})
        # No LLM backend: nothing here samples, and starting one (torch, the tiny model) would load
        # this process and the machine while the rounds run.
        with (
            embedded(settings, with_flower=False, stages=(), with_llm=False) as stack,
            FarmClient(stack.settings.api_url, token="bench", timeout_s=120) as client,
        ):
            rates: list[float] = []
            raw_rates: list[float] = []
            for round_ in range(-args.warmup, args.rounds):
                started = time.perf_counter()
                assert raw_read(db, batch_id) == tokens
                raw_rate = tokens / (time.perf_counter() - started)
                started = time.perf_counter()
                results = client.results(batch_id, page_size=args.page_size, wait_s=0)
                trajs = [r.trajectory for r in results if r.trajectory is not None]
                arrays = to_arrays(trajs)
                elapsed = time.perf_counter() - started
                assert int(arrays["attention_mask"].sum()) == tokens
                rate = tokens / elapsed
                if round_ >= 0:
                    rates.append(rate)
                    raw_rates.append(raw_rate)
                print(
                    f"{'round' if round_ >= 0 else 'warm-up'}: {len(trajs)} trajectories, {tokens / 1e6:.2f} M tokens:"
                    f" API {rate / 1e6:.2f} M tokens/s, raw read {raw_rate / 1e6:.2f} M tokens/s,"
                    f" ratio {rate / raw_rate:.2f}"
                )
    median, raw_median = statistics.median(rates), statistics.median(raw_rates)
    ratio = statistics.median(rate / raw for rate, raw in zip(rates, raw_rates, strict=True))
    print(f"median of {args.rounds}: API {median / 1e6:.2f} M tokens/s, raw {raw_median / 1e6:.2f} M tokens/s")
    print(f"ratio to raw (median of the rounds' ratios): {ratio:.2f} (target >= 0.5)")
    emit({"tokens_per_s": round(median), "raw_tokens_per_s": round(raw_median), "ratio_to_raw": round(ratio, 3)})


if __name__ == "__main__":
    main()
