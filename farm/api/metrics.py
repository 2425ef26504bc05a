"""``/metrics``: the farm in Prometheus text format, computed when it is scraped.

Every family is present even when idle (a job state with no job is a 0, not a missing series),
so dashboards and alerts see zeros instead of gaps. Backends' own figures (prefix-cache hits,
requests running) are read from their ``/metrics`` (vLLM's names; the built-in backend uses the
same) with a short timeout, in parallel: one that does not answer is reported by
``farm_backend_up 0`` and holds up the scrape by at most ``BACKEND_TIMEOUT_S``.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from concurrent.futures import ThreadPoolExecutor
from datetime import datetime, timedelta

import httpx
from sqlalchemy import func, or_, select
from sqlalchemy.orm import Session

from farm import metrics, signals
from farm.api.deps import AppState
from farm.constants import BatchState, JobState, Outcome, Stage, queue_name
from farm.db import reads
from farm.db.base import utcnow
from farm.db.models import Batch, Job, Node
from farm.deadlines.shares import seconds_to
from farm.llm.balancer import Backend
from farm.schemas import BatchStatus, QueueOut

BACKEND_TIMEOUT_S = 1.0
#: batches whose tail /metrics shows: running ones and those finished this recently, at most this many.
TAIL_WINDOW_S = 3600.0
TAIL_BATCHES = 50
#: what is read from each backend's /metrics, and the name it gets here.
BACKEND_FIGURES = {
    "vllm:prefix_cache_queries_total": "farm_backend_prefix_cache_queries_total",
    "vllm:prefix_cache_hits_total": "farm_backend_prefix_cache_hits_total",
    "vllm:num_requests_running": "farm_backend_requests_running",
    "vllm:num_requests_waiting": "farm_backend_requests_waiting",
}


def render(state: AppState, db: Session) -> str:
    out = metrics.Exposition()
    _jobs(out, db)
    _tails(out, db)
    _stages(out, state)
    _queues(out, state, db)
    _workers(out, state)
    _backends(out, state.balancer.backends())
    _sandboxes_and_proxy(out, state)
    _signals(out, state)
    _running_batches(out, db)
    return out.text()


def _jobs(out: metrics.Exposition, db: Session) -> None:
    counts = reads.summary_counts(db)
    out.family("farm_jobs", "gauge", "Jobs of running batches, by state.")
    for job_state in JobState:
        out.sample("farm_jobs", counts.get(job_state.value, 0), {"state": job_state.value})
    rows = db.execute(
        select(Job.type, Job.outcome, func.count()).where(Job.outcome.is_not(None)).group_by(Job.type, Job.outcome)
    ).all()
    finished = {(task_type, outcome.value): n for task_type, outcome, n in rows if outcome is not None}
    out.family("farm_jobs_finished_total", "counter", "Jobs that ended, by task type and outcome.")
    for task_type in sorted({t for t, _ in finished}):
        for outcome in Outcome:  # every outcome of a type that has ended once, zeros included
            labels = {"type": task_type, "outcome": outcome.value if outcome else ""}
            out.sample("farm_jobs_finished_total", finished.get((task_type, outcome.value), 0), labels)


def _tails(out: metrics.Exposition, db: Session) -> None:
    """Each recent batch's time to 50/90/99/100% of its jobs, and its readiness (a quorum's batches)."""
    since = utcnow() - timedelta(seconds=TAIL_WINDOW_S)
    batches = db.execute(
        select(Batch.id, Batch.created_at, Batch.total_jobs, Batch.ready_at, Batch.ready_seq, Batch.quorum)
        .where(or_(Batch.state == BatchState.RUNNING, Batch.finished_at > since))
        .order_by(Batch.id.desc())
        .limit(TAIL_BATCHES)
    ).all()
    finished: dict[int, list[datetime]] = {b.id: [] for b in batches}
    if batches:
        rows = db.execute(
            select(Job.batch_id, Job.finished_at).where(
                Job.batch_id.in_(list(finished)), Job.finished_at.is_not(None), Job.outcome != Outcome.CANCELLED
            )
        )
        for batch_id, at in rows:
            if at is not None:
                finished[batch_id].append(at)
    out.family(
        "farm_batch_seconds_to", "gauge", "Seconds from submit until a share of the batch's jobs finished (recent)."
    )
    for b in batches:
        for share, seconds in seconds_to(b.created_at, finished[b.id], b.total_jobs).items():
            if seconds is not None:
                out.sample("farm_batch_seconds_to", seconds, {"batch": str(b.id), "share": share})
    out.family("farm_batch_carried_jobs", "gauge", "Jobs past a ready batch's step (carried or cut), recent ones.")
    for b in batches:
        if b.ready_seq is not None:
            rest = (b.quorum or {}).get("rest", "cancel")
            out.sample("farm_batch_carried_jobs", b.total_jobs - b.ready_seq, {"batch": str(b.id), "rest": rest})


def _stages(out: metrics.Exposition, state: AppState) -> None:
    out.family(
        "farm_stage_seconds", "histogram", "How long a stage ran (recorded stages only), by stage and task type."
    )
    for h in metrics.read_stage_histograms(state.redis):
        out.histogram(
            "farm_stage_seconds", metrics.STAGE_BUCKETS, h.buckets, h.sum, {"stage": h.stage, "type": h.task_type}
        )


def queue_lengths(state: AppState, db: Session) -> list[QueueOut]:
    """INIT's queue, and RUN's and EVAL's of every node the database knows (and this one's)."""
    nodes = set(db.scalars(select(Node.name)).all()) | {state.settings.worker.node}
    queues = [(Stage.INIT, None)] + [(stage, node) for node in sorted(nodes) for stage in (Stage.RUN, Stage.EVAL)]
    pipe = state.redis.pipeline(transaction=False)
    for stage, node in queues:
        pipe.llen(queue_name(stage, node))
    return [
        QueueOut(name=queue_name(stage, node), stage=stage, node=node, length=length)
        for (stage, node), length in zip(queues, pipe.execute(), strict=True)
    ]


def _queues(out: metrics.Exposition, state: AppState, db: Session) -> None:
    out.family(
        "farm_queue_length", "gauge", "Stage messages waiting in each queue (INIT is shared; RUN and EVAL per node)."
    )
    for q in queue_lengths(state, db):
        out.sample("farm_queue_length", q.length, {"queue": q.name, "stage": q.stage.value, "node": q.node or ""})


def _workers(out: metrics.Exposition, state: AppState) -> None:
    processes: dict[tuple[str, str], int] = {}
    slots: dict[tuple[str, str], int] = {}
    for w in metrics.read_workers(state.redis):
        for stage in w.stages:
            processes[w.node, stage] = processes.get((w.node, stage), 0) + 1
            slots[w.node, stage] = slots.get((w.node, stage), 0) + w.slots
    out.family("farm_workers", "gauge", "Worker processes alive, by node and stage they serve.")
    for (node, stage), n in sorted(processes.items()):
        out.sample("farm_workers", n, {"node": node, "stage": stage})
    out.family("farm_worker_slots", "gauge", "Stages the workers can run at once, by node and stage.")
    for (node, stage), n in sorted(slots.items()):
        out.sample("farm_worker_slots", n, {"node": node, "stage": stage})


def _backends(out: metrics.Exposition, backends: list[Backend]) -> None:
    figures = _backend_figures(backends)
    per_backend: list[tuple[str, str, str, Callable[[Backend], int]]] = [
        (
            "farm_backend_inflight",
            "gauge",
            "Jobs holding a lease on the backend (the balancer's load).",
            lambda b: b.inflight,
        ),
        ("farm_backend_capacity", "gauge", "Jobs the backend is given at once.", lambda b: b.capacity),
        ("farm_backend_healthy", "gauge", "1 if the balancer sends work to the backend.", lambda b: int(b.healthy)),
        ("farm_backend_weight_version", "gauge", "The weights the backend serves.", lambda b: b.weight_version),
        (
            "farm_backend_up",
            "gauge",
            "1 if the backend's /metrics answered this scrape.",
            lambda b: int(b.id in figures),
        ),
    ]
    for name, kind, help_text, value in per_backend:
        out.family(name, kind, help_text)
        for b in backends:
            out.sample(name, value(b), {"backend": b.id, "kind": b.kind})
    for theirs, ours in BACKEND_FIGURES.items():
        kind = "counter" if ours.endswith("_total") else "gauge"
        out.family(ours, kind, f"The backend's own {theirs} (tokens for the prefix cache).")
        for b in backends:
            if (figure := figures.get(b.id, {}).get(theirs)) is not None:
                out.sample(ours, figure, {"backend": b.id, "kind": b.kind})


def _backend_figures(backends: list[Backend]) -> dict[str, dict[str, float]]:
    """Per backend that answered: the figures of ``BACKEND_FIGURES`` it reported."""
    if not backends:
        return {}

    def scrape(backend: Backend) -> dict[str, float] | None:
        try:
            response = httpx.get(f"{backend.url.rstrip('/')}/metrics", timeout=BACKEND_TIMEOUT_S)
            response.raise_for_status()
        except httpx.HTTPError:
            return None
        return sum_samples(response.text.splitlines(), BACKEND_FIGURES.keys())

    with ThreadPoolExecutor(max_workers=min(16, len(backends))) as pool:
        answers = list(pool.map(scrape, backends))
    return {b.id: figures for b, figures in zip(backends, answers, strict=True) if figures is not None}


def sum_samples(lines: Iterable[str], wanted: Iterable[str]) -> dict[str, float]:
    """The sum over label sets of each wanted family (a vLLM with several engines reports each)."""
    wanted = set(wanted)
    totals: dict[str, float] = {}
    for line in lines:
        if not line or line.startswith("#"):
            continue
        name = line.split("{", 1)[0].split(" ", 1)[0]
        if name not in wanted:
            continue
        try:
            totals[name] = totals.get(name, 0.0) + float(line.rsplit(" ", 1)[1])
        except (IndexError, ValueError):
            continue
    return totals


def _sandboxes_and_proxy(out: metrics.Exposition, state: AppState) -> None:
    out.family("farm_sandboxes", "gauge", "Live sandboxes on each node (as its workers last counted).")
    for node, count in sorted(metrics.read_sandboxes(state.redis).items()):
        out.sample("farm_sandboxes", count, {"node": node})
    calls = metrics.read_proxy_calls(state.redis)
    out.family("farm_proxy_calls_total", "counter", "Calls through the OpenAI/Anthropic proxy, by how they ended.")
    for outcome in sorted({"ok", "failed", *calls}):
        out.sample("farm_proxy_calls_total", calls.get(outcome, 0), {"outcome": outcome})


#: help text of the figures ``farm.signals`` keeps.
SIGNAL_HELP = {
    "farm_reward": "Rewards of scored jobs, by task type (mean: _sum / _count).",
    "farm_episode_turns": "Model turns per recorded episode, by task type.",
    "farm_episode_tokens": "Tokens per recorded episode (prompt, observations and sampled), by task type.",
    "farm_proxy_call_seconds": "How long a recorded proxy call took, from its arrival to its answer.",
    "farm_sampled_tokens_total": "Tokens the model sampled in recorded episodes (loss mask 1), by task type.",
    "farm_prompt_tokens_total": "Episode tokens the model did not sample (prompt, observations), by task type.",
    "farm_backend_sampled_tokens_total": "Tokens each backend sampled (built-in loop and proxy calls).",
    "farm_backend_prompt_tokens_total": "Prompt tokens each backend was sent (every call's whole prompt).",
}
_SIGNAL_COUNTERS = ("farm_sampled_tokens_total", "farm_prompt_tokens_total")
_BACKEND_COUNTERS = ("farm_backend_sampled_tokens_total", "farm_backend_prompt_tokens_total")


def _signals(out: metrics.Exposition, state: AppState) -> None:
    by_family: dict[str, list[signals.Histogram]] = {family: [] for family in signals.HISTOGRAMS}
    for h in signals.read_histograms(state.redis):
        by_family[h.family].append(h)
    for family, bounds in signals.HISTOGRAMS.items():
        out.family(family, "histogram", SIGNAL_HELP[family])
        for h in by_family[family]:
            out.histogram(family, bounds, h.buckets, h.sum, h.labels)
    counters = signals.read_counters(state.redis, _SIGNAL_COUNTERS + _BACKEND_COUNTERS)
    for family in _SIGNAL_COUNTERS + _BACKEND_COUNTERS:
        out.family(family, "counter", SIGNAL_HELP[family])
        for labels, n in counters[family]:
            out.sample(family, n, labels)
    backends = state.balancer.backends()
    rates = signals.recent_tokens_per_s(state.redis, [b.id for b in backends])
    out.family(
        "farm_backend_sampled_tokens_per_second",
        "gauge",
        f"Tokens each backend sampled per second over the last {signals.RECENT_WINDOW_S} s (calls that ended).",
    )
    for b in backends:
        out.sample("farm_backend_sampled_tokens_per_second", rates.get(b.id, 0.0), {"backend": b.id, "kind": b.kind})


def _running_batches(out: metrics.Exposition, db: Session) -> None:
    """Outcomes and mean reward of each running batch by task type (running only: the series end with it)."""
    rows = db.execute(
        select(Job.batch_id, Job.type, Job.outcome, func.count(), func.sum(Job.reward), func.count(Job.reward))
        .join(Batch, Batch.id == Job.batch_id)
        .where(Batch.state == BatchState.RUNNING, Job.outcome.is_not(None))
        .group_by(Job.batch_id, Job.type, Job.outcome)
    ).all()
    out.family("farm_batch_jobs_finished", "gauge", "Finished jobs of each running batch, by task type and outcome.")
    rewards: dict[tuple[int, str], tuple[float, int]] = {}
    for batch_id, task_type, outcome, n, reward_sum, scored in rows:
        labels = {"batch": str(batch_id), "type": task_type, "outcome": outcome.value if outcome else ""}
        out.sample("farm_batch_jobs_finished", n, labels)
        if scored:
            total, count = rewards.get((batch_id, task_type), (0.0, 0))
            rewards[batch_id, task_type] = (total + float(reward_sum or 0.0), count + int(scored))
    out.family("farm_batch_reward_mean", "gauge", "Mean reward of each running batch's scored jobs, by task type.")
    for (batch_id, task_type), (total, count) in sorted(rewards.items()):
        out.sample("farm_batch_reward_mean", total / count, {"batch": str(batch_id), "type": task_type})


def with_tokens(state: AppState, status: BatchStatus) -> BatchStatus:
    """The batch's status with its sampled tokens and their pace (kept in Redis, ``farm.signals``)."""
    sampled = signals.batch_tokens(state.redis, status.id).get("sampled")
    if sampled is None:
        return status
    pace = sampled / status.elapsed_s if status.elapsed_s > 0 else None
    return status.model_copy(update={"sampled_tokens": sampled, "tokens_per_s": pace})
