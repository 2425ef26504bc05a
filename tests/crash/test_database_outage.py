"""A database that restarts or is full costs time, never an attempt or a job (issue 29).

Real ``farm`` processes on the crash suite's private PostgreSQL: (a) PostgreSQL stopped ``-m
immediate`` and started again, twice, while a trainer reads ``FarmClient.results()`` with nothing of
its own around it (no reconnect loop: the client's retries ride the restarts out); (b) every
connection PostgreSQL has left taken by someone else while the workers start and the batch runs,
then given back. Each job is yielded once, every job ends done, and in (b) no stage needed a second
attempt.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import psycopg
import pytest

from farm.client import JobResult, RetryPolicy
from farm.constants import JobState
from farm.db.session import libpq_url
from tests.crash.harness import Farm, PrivatePostgres, stage_runs, summary, wait_for

pytestmark = [pytest.mark.crash, pytest.mark.timeout(600)]

JOBS = 60
SLEEPS = {"init": 0.1, "run": 0.5, "eval": 0.1}
DEADLINE_S = 240.0


def echo(i: int) -> dict[str, Any]:
    return {"type": "echo", "config": {"text": f"outage job {i}", "sleep_s": SLEEPS}}


class Trainer:
    """A trainer's loop: ``for result in client.results(batch)``, once, on a thread."""

    def __init__(self, farm: Farm, batch_id: int) -> None:
        self.results: list[JobResult] = []
        self.error: BaseException | None = None
        self._farm, self._batch_id = farm, batch_id
        self._thread = threading.Thread(target=self._read, name="trainer", daemon=True)
        self._thread.start()

    def _read(self) -> None:
        try:
            # Ample for a restart; the default (120 s) would do too, this bounds a failing test.
            with self._farm.client(timeout_s=10, retry=RetryPolicy(total_s=90)) as client:
                for result in client.results(self._batch_id, wait_s=2, encoding="json"):
                    self.results.append(result)
        except BaseException as exc:  # the test reports it
            self.error = exc

    def join(self, timeout_s: float) -> None:
        self._thread.join(timeout_s)
        assert not self._thread.is_alive(), f"the trainer's loop still runs: {len(self.results)} results"


def start_farm(farm: Farm, *, workers: bool = True) -> None:
    farm.add("api", ["api"])
    if workers:
        start_workers(farm)
    farm.wait_api()


def start_workers(farm: Farm) -> None:
    for stage in ("init", "run", "eval"):
        farm.add_worker("outage", stage, 0)


def check_once_each(trainer: Trainer, job_ids: list[int]) -> None:
    assert trainer.error is None, f"results() raised out of the trainer's loop: {trainer.error!r}"
    streamed = [r.job.id for r in trainer.results]
    assert len(streamed) == len(set(streamed)), "a job was yielded twice"
    assert sorted(streamed) == sorted(job_ids)
    assert [r.seq for r in trainer.results] == list(range(1, len(job_ids) + 1))
    assert {r.job.state for r in trainer.results} == {JobState.DONE}


def test_results_ride_out_postgres_restarts_each_job_once(make_farm, crash_db: str, pg_server: PrivatePostgres):
    farm: Farm = make_farm(nodes=["outage"])
    start_farm(farm)
    with farm.client() as client:
        batch = client.submit([echo(i) for i in range(JOBS)])
    trainer = Trainer(farm, batch.id)
    for restart in (1, 2):
        seen = 15 * restart
        wait_for(lambda: len(trainer.results) >= seen, timeout_s=DEADLINE_S, what=f"{seen} results")  # noqa: B023
        pg_server.stop_immediate()
        time.sleep(3.0)
        pg_server.start()
        farm.faults["postgres_stop_immediate"] += 1
    trainer.join(DEADLINE_S)
    check_once_each(trainer, batch.job_ids)
    attempts = stage_runs(crash_db, batch.id)
    summary(
        "postgres restarts mid-results",
        jobs=JOBS,
        faults=farm.faults,
        seconds=float("nan"),
        extra=f"yielded={len(trainer.results)} attempts[{' '.join(f'{k}={v}' for k, v in sorted(attempts.items()))}]",
    )


@contextmanager
def every_free_connection(url: str) -> Iterator[int]:
    """Takes every connection PostgreSQL has left ("too many clients" for anyone else) until exit."""
    held: list[psycopg.Connection[Any]] = []
    try:
        while True:
            try:
                held.append(psycopg.connect(libpq_url(url), autocommit=True))
            except psycopg.OperationalError as exc:
                assert "too many" in str(exc) or "reserved" in str(exc), exc
                break
        yield len(held)
    finally:
        for conn in held:
            conn.close()


def test_a_full_database_costs_time_not_attempts(make_farm, crash_db: str):
    farm: Farm = make_farm(nodes=["outage"])
    start_farm(farm, workers=False)
    with farm.client() as client:
        batch = client.submit([echo(i) for i in range(JOBS)])
    trainer = Trainer(farm, batch.id)
    with every_free_connection(crash_db) as taken:
        # Workers that start now find no connection at all: each claim waits for one, longer than a
        # lease and its grace (3 s each here), so a claim that leased from its first try would be swept.
        start_workers(farm)
        time.sleep(12.0)
        assert not trainer.results, "no stage can have completed without a connection"
    farm.faults["database_full_12s"] += 1
    trainer.join(DEADLINE_S)
    check_once_each(trainer, batch.job_ids)
    attempts = stage_runs(crash_db, batch.id)
    # Waiting for a connection is not an attempt: one ok run per stage per job, nothing else.
    assert attempts == {"init:ok": JOBS, "run:ok": JOBS, "eval:ok": JOBS}, attempts
    summary(
        "database full",
        jobs=JOBS,
        faults=farm.faults,
        seconds=float("nan"),
        extra=f"connections_taken={taken} yielded={len(trainer.results)}",
    )
