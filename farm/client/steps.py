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
from farm.schemas import JobResult, ResultsPage

if TYPE_CHECKING:
    from farm.client.client import FarmClient


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


def read_step(client: FarmClient, batch_id: int, carry: CarryCursor | None, *, wait_s: float) -> Step:
    """See ``FarmClient.step``."""
    results: list[JobResult] = []
    after = 0
    while True:
        page = client.results_page(batch_id, after=after, wait_s=wait_s, until_ready=True)
        ready_seq = page.ready_seq
        for item in page.items:
            if ready_seq is not None and item.seq > ready_seq:
                break
            results.append(item)
            after = item.seq
        if ready_seq is not None and after >= ready_seq:
            break
        if ready_seq is None and _all_read(page, after):
            break
    carried = drain(client, carry) if carry is not None else []
    reason = None
    if ready_seq is not None:
        status = client.status(batch_id)
        readiness = status.readiness
        reason = readiness.reason if readiness is not None else None
        if carry is not None and readiness is not None and readiness.rest == "carry" and ready_seq < status.total_jobs:
            carry.pending[batch_id] = ready_seq
    return Step(batch_id=batch_id, results=results, carried=carried, ready_reason=reason)


def drain(client: FarmClient, carry: CarryCursor) -> list[JobResult]:
    """The carried jobs that ended since the cursor, without waiting; batches read to their end leave it."""
    out: list[JobResult] = []
    for batch_id, after in sorted(carry.pending.items()):
        while True:
            page = client.results_page(batch_id, after=after, wait_s=0)
            out += page.items
            after = page.next_cursor
            carry.pending[batch_id] = after
            if not page.items:
                break
        if _all_read(page, after):
            del carry.pending[batch_id]
    return out


def _all_read(page: ResultsPage, after: int) -> bool:
    return page.batch_state is not BatchState.RUNNING and after >= page.finished
