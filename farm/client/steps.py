"""A training step out of a batch with a quorum, and the carried jobs of earlier steps, each once.

A batch with a ``quorum`` is *ready* once enough of it finished or its deadline passed; its finish
positions 1..``ready_seq`` are the step. With ``rest: "carry"`` its other jobs keep running and take
the positions after ``ready_seq`` as they end. ``CarryCursor`` is where the trainer is in each earlier
batch's carried jobs (batch id -> the last position read): each step reads what ended since, and the
dense finish order makes that exactly once. Keep it with the trainer's checkpoint (``to_json``,
``from_json``): a trainer restarted from its checkpoint reads each carried job once more from there.

    carry = CarryCursor()
    for step in range(steps):
        batch = farm.submit(tasks, quorum={"min_fraction": 0.95, "rest": "carry"})
        got = farm.step(batch.id, carry)        # got.results: this batch's step; got.carried: late ones
        train(got.results + got.carried)          # each trajectory's weight_versions says what sampled it
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from farm.constants import BatchState
from farm.schemas import BatchStatus, JobResult, ResultsPage

if TYPE_CHECKING:
    from farm.client.client import AsyncFarmClient, FarmClient


class CarryCursor:
    """The trainer's place in each earlier batch's carried jobs (see the module docstring)."""

    def __init__(self, pending: dict[int, int] | None = None) -> None:
        #: batch id -> the last finish position read; a batch leaves once all its jobs were read.
        self.pending: dict[int, int] = dict(pending or {})

    def to_json(self) -> str:
        return json.dumps({str(batch_id): seq for batch_id, seq in self.pending.items()})

    @classmethod
    def from_json(cls, text: str) -> CarryCursor:
        return cls({int(batch_id): int(seq) for batch_id, seq in json.loads(text).items()})


@dataclass
class Step:
    """What one step hands the trainer."""

    batch_id: int
    #: the batch's step: its results 1..ready_seq (a batch without a quorum: all of them).
    results: list[JobResult]
    #: carried jobs of earlier batches that ended since the last step, each once, in finish order.
    carried: list[JobResult] = field(default_factory=list)
    #: quorum or deadline (None: no quorum, the whole batch).
    ready_reason: str | None = None


def _take(page: ResultsPage, results: list[JobResult], after: int) -> tuple[int, bool]:
    """Add a page's results of the step; returns the new cursor and whether the step is read."""
    ready_seq = page.ready_seq
    for item in page.items:
        if ready_seq is not None and item.seq > ready_seq:
            break
        results.append(item)
        after = item.seq
    if ready_seq is not None:
        return after, after >= ready_seq
    return after, _all_read(page, after)


def _registered(carry: CarryCursor | None, batch_id: int, ready_seq: int | None, status: BatchStatus) -> str | None:
    """The step's reason; a batch with jobs carried past it joins the cursor."""
    readiness = status.readiness
    if ready_seq is None or readiness is None:
        return None
    if carry is not None and readiness.rest == "carry" and ready_seq < status.total_jobs:
        carry.pending[batch_id] = ready_seq
    return readiness.reason


def _drained(carry: CarryCursor, batch_id: int, page: ResultsPage, out: list[JobResult]) -> bool:
    """Add a carried page; True when the batch has no more to read now (and leaves the cursor if done)."""
    out += page.items
    carry.pending[batch_id] = page.next_cursor
    if page.items:
        return False
    if _all_read(page, page.next_cursor):
        del carry.pending[batch_id]
    return True


def read_step(client: FarmClient, batch_id: int, carry: CarryCursor | None, *, wait_s: float) -> Step:
    """See ``FarmClient.step``."""
    results: list[JobResult] = []
    after, done = 0, False
    while not done:
        page = client.results_page(batch_id, after=after, wait_s=wait_s, until_ready=True)
        after, done = _take(page, results, after)
    carried = drain(client, carry) if carry is not None else []
    reason = None if page.ready_seq is None else _registered(carry, batch_id, page.ready_seq, client.status(batch_id))
    return Step(batch_id=batch_id, results=results, carried=carried, ready_reason=reason)


def drain(client: FarmClient, carry: CarryCursor) -> list[JobResult]:
    """The carried jobs that ended since the cursor, without waiting; batches read to their end leave it."""
    out: list[JobResult] = []
    for batch_id, after in sorted(carry.pending.items()):
        while not _drained(carry, batch_id, client.results_page(batch_id, after=after, wait_s=0), out):
            after = carry.pending[batch_id]
    return out


async def read_step_async(client: AsyncFarmClient, batch_id: int, carry: CarryCursor | None, *, wait_s: float) -> Step:
    """See ``AsyncFarmClient.step``."""
    results: list[JobResult] = []
    after, done = 0, False
    while not done:
        page = await client.results_page(batch_id, after=after, wait_s=wait_s, until_ready=True)
        after, done = _take(page, results, after)
    carried = await drain_async(client, carry) if carry is not None else []
    status = None if page.ready_seq is None else await client.status(batch_id)
    reason = None if status is None else _registered(carry, batch_id, page.ready_seq, status)
    return Step(batch_id=batch_id, results=results, carried=carried, ready_reason=reason)


async def drain_async(client: AsyncFarmClient, carry: CarryCursor) -> list[JobResult]:
    """See ``drain``."""
    out: list[JobResult] = []
    for batch_id, after in sorted(carry.pending.items()):
        while not _drained(carry, batch_id, await client.results_page(batch_id, after=after, wait_s=0), out):
            after = carry.pending[batch_id]
    return out


def _all_read(page: ResultsPage, after: int) -> bool:
    return page.batch_state is not BatchState.RUNNING and after >= page.finished
