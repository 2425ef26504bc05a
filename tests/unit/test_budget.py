"""The connection budget (farm.db.budget) and what counts as an unavailable database (farm.db.session)."""

from __future__ import annotations

import logging
from pathlib import Path

import psycopg
import pytest
from sqlalchemy.exc import IntegrityError, OperationalError, ProgrammingError
from sqlalchemy.exc import TimeoutError as PoolTimeout

from farm.config import Settings
from farm.db.budget import api_pools, deployment, proxy_process_pools, worker_pools
from farm.db.session import unavailable, waiting_out

OPERATIONS = Path(__file__).resolve().parents[2] / "docs" / "operations.md"


def _settings(**database: object) -> Settings:
    return Settings.model_validate({"database": database})


@pytest.mark.parametrize(("slots", "claims"), [(1, 1), (2, 1), (32, 1), (33, 2), (64, 2), (100, 4)])
def test_a_worker_gets_a_claims_connection_per_slots_per_connection_and_one_more_for_upkeep(slots, claims):
    assert dict(worker_pools(Settings(), slots).pools) == {"main": claims + 1, "claims": claims}


def test_a_deployment_counts_a_worker_per_stage_per_node_and_its_api():
    settings = Settings()
    assert deployment(settings, 1).per_node == 3 * 3
    assert api_pools(settings).total == 10 + 2 * 2 + 4 * 2
    assert [deployment(settings, n).total for n in (1, 8, 16)] == [31, 94, 166]
    assert deployment(settings, 8, api_processes=2, proxy_processes=4).total == 8 * 9 + 2 * 22 + 4 * 16
    assert proxy_process_pools(settings).total == 16
    smaller = _settings(pool_size=2, max_overflow=0, proxy_pool_size=1, worker_slots_per_connection=64)
    assert deployment(smaller, 16).total == 16 * 9 + (2 + 2 + 4)  # a worker needs its 3 at any slots


def test_operations_states_the_budget_the_code_computes():
    text = " ".join(OPERATIONS.read_text().split())
    totals = {n: deployment(Settings(), n).total for n in (1, 8, 16)}
    assert f"{totals[1]} for 1 node, {totals[8]} for 8, {totals[16]} for 16" in text


def _wrapped(exc: Exception, *, invalidated: bool = False) -> Exception:
    cls = OperationalError if isinstance(exc, psycopg.OperationalError) else ProgrammingError
    return cls("select 1", {}, exc, connection_invalidated=invalidated)


@pytest.mark.parametrize(
    ("exc", "expected"),
    [
        (PoolTimeout("QueuePool limit of size 1 overflow 0 reached"), True),
        (_wrapped(psycopg.OperationalError("FATAL: sorry, too many clients already")), True),
        (_wrapped(psycopg.OperationalError("the database system is starting up")), True),
        (_wrapped(psycopg.errors.AdminShutdown("terminating connection due to administrator command")), True),
        (_wrapped(psycopg.ProgrammingError("syntax error"), invalidated=True), True),
        (_wrapped(psycopg.ProgrammingError("syntax error")), False),
        (IntegrityError("insert", {}, psycopg.IntegrityError("duplicate key")), False),
        (ValueError("not the database"), False),
    ],
    ids=["pool-timeout", "too-many-clients", "starting-up", "admin-shutdown", "invalidated", "bad-sql", "dup", "other"],
)
def test_what_counts_as_an_unavailable_database(exc, expected):
    assert unavailable(exc) is expected


def test_waiting_out_tries_again_while_unavailable_and_raises_anything_else_at_once():
    settings = _settings(unavailable_wait_s=60, unavailable_backoff_s=0.4)
    log = logging.getLogger("test_budget")
    slept: list[float] = []
    outcomes: list[Exception | str] = [PoolTimeout("busy") for _ in range(5)]
    outcomes.append("done")

    def call() -> str:
        outcome = outcomes.pop(0)
        if isinstance(outcome, Exception):
            raise outcome
        return outcome

    assert waiting_out(call, settings=settings, what="claim", log=log, sleep=slept.append) == "done"
    assert len(slept) == 5 and all(0 < s <= 0.4 for s in slept)
    with pytest.raises(ValueError):
        waiting_out(lambda: int("x"), settings=settings, what="claim", log=log, sleep=slept.append)
    assert len(slept) == 5


def test_waiting_out_gives_up_after_the_wait():
    settings = _settings(unavailable_wait_s=0)

    def busy() -> None:
        raise PoolTimeout("busy")

    with pytest.raises(PoolTimeout):
        waiting_out(busy, settings=settings, what="claim", log=logging.getLogger("x"), sleep=lambda s: None)
