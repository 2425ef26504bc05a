"""A batch's tail as its trainer sees it: how long until a share of it was done, and what fell past
the point it was ready (carried or cut), by task, length and turns, so a bias toward short or easy
tasks shows instead of being guessed at."""

from __future__ import annotations

from dataclasses import dataclass, field

from sqlalchemy import func, select
from sqlalchemy.orm import Session

from farm.constants import Outcome
from farm.db.models import Batch, Group, Job, Trajectory
from farm.db.reads import get_batch, readiness
from farm.deadlines.shares import seconds_to
from farm.schemas import BatchTail, TailShare, TaskTail


@dataclass
class _Share:
    jobs: int = 0
    tokens: list[int] = field(default_factory=list)
    turns: list[int] = field(default_factory=list)

    def add(self, tokens: int | None, turns: int | None) -> None:
        self.jobs += 1
        if tokens is not None and turns is not None:
            self.tokens.append(tokens)
            self.turns.append(turns)

    def out(self) -> TailShare:
        def mean(values: list[int]) -> float | None:
            return sum(values) / len(values) if values else None

        return TailShare(jobs=self.jobs, mean_tokens=mean(self.tokens), mean_turns=mean(self.turns))


def batch_tail(session: Session, batch_id: int) -> BatchTail:
    """The batch's tail figures and what was carried or cut, by task.

    Raises:
        BatchNotFound: no batch ``batch_id``.
    """
    batch = get_batch(session, batch_id)
    rows = session.execute(
        select(
            Job.finish_seq,
            Job.finished_at,
            Job.outcome,
            Group.name,
            Group.type,
            Group.index,
            Trajectory.num_tokens,
            func.length(Trajectory.turn_offsets).label("offsets_bytes"),
        )
        .join(Group, Group.id == Job.group_id)
        .outerjoin(Trajectory, Trajectory.job_id == Job.id)
        .where(Job.batch_id == batch_id)
    ).all()
    finished = [r.finished_at for r in rows if r.finished_at is not None and r.outcome is not Outcome.CANCELLED]
    parts = {"pool": _Share(), "step": _Share(), "carried": _Share(), "cut": _Share()}
    by_task: dict[str, dict[str, _Share]] = {}
    for r in rows:
        # turn_offsets: the prompt's span, then a model turn and what followed it, and so on.
        turns = None if r.offsets_bytes is None else int(r.offsets_bytes) // 4 // 2
        part = _part_of(batch, r.finish_seq, r.outcome)
        name = r.name or f"{r.type}#{r.index}"
        task = by_task.setdefault(name, {"step": _Share(), "carried": _Share(), "cut": _Share()})
        task[part].add(r.num_tokens, turns)
        parts[part].add(r.num_tokens, turns)
        if r.num_tokens is not None:
            parts["pool"].add(r.num_tokens, turns)
    return BatchTail(
        batch_id=batch.id,
        total_jobs=batch.total_jobs,
        seconds_to=seconds_to(batch.created_at, finished, batch.total_jobs),
        readiness=readiness(batch),
        pool=parts["pool"].out(),
        step=parts["step"].out(),
        carried=parts["carried"].out(),
        cut=parts["cut"].out(),
        by_task=[
            TaskTail(task=name, step=shares["step"].out(), carried=shares["carried"].out(), cut=shares["cut"].out())
            for name, shares in sorted(by_task.items())
        ],
    )


def _part_of(batch: Batch, finish_seq: int | None, outcome: Outcome | None) -> str:
    """step: in the batch's step (or no quorum, or not ready yet); carried: past ready, left running;
    cut: past ready, cancelled by the commit that made the batch ready."""
    if batch.ready_seq is None or (finish_seq is not None and finish_seq <= batch.ready_seq):
        return "step"
    rest = (batch.quorum or {}).get("rest", "cancel")
    return "cut" if rest == "cancel" and outcome is Outcome.CANCELLED else "carried"
