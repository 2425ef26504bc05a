"""The farm as TRL's rollout worker and weight transfer (TRL >= 1.16: ``trl.experimental.async_grpo``).

``AsyncGRPOTrainer(..., rollout_worker=FarmRolloutWorker(...), weight_transfer=FarmWeightTransfer(...))``:
the trainer keeps its loss, packing and optimizer; the farm runs every episode (sandboxes, tools,
graders, harnesses through its proxy) on its own backends and hands back token-exact rows.

``FarmRolloutWorker`` (TRL's ``RolloutWorkerProtocol``) cycles the prompt dataset, submits each
row's farm task as a group of ``num_generations`` samples, a batch of ``groups_per_batch`` groups at
a time, as long as the trainer can still take them fresh (every step up to ``max_staleness``
versions ahead, plus the micro-batch TRL's data loader reads ahead) and fewer than
``max_inflight_groups`` groups are out (from submit until their samples are in the buffer; a full
buffer blocks), streams each batch's jobs as they finish and, once a group's last job is in, puts
one ``RolloutSample`` per segment of each trajectory on ``rollout_buffer``: the whole sequence
(prompt, model turns with mask 1 and the farm's logprobs, tool results and generation prompts with
mask 0), the group-relative advantage, and the TRL version of the oldest weights that sampled it.
Each batch asks the farm for ``max_staleness`` (TRL's), so a rollout already too stale when its RUN
ends is run again on fresh weights instead of being dropped by the trainer.

A job that ends without a reward (an infrastructure failure) is never a reward of 0: a group with
fewer than two scored samples is submitted again, up to ``max_retries`` times, then ``check_health``
raises. ``check_health`` (TRL calls it whenever the buffer stays empty) also raises when the farm has
no healthy backend, no worker for a stage, or has finished no job of ours for ``stale_after_s``.

``FarmWeightTransfer`` (TRL's ``WeightTransferProtocol``) maps ``pause`` onto a farm weight update
(mode ``keep`` by default: turns in flight freeze and continue on the new weights, nothing is lost),
``send_weights`` onto a safetensors checkpoint in ``checkpoint_dir`` that every backend loads (the
built-in backend, vLLM through its reload route: the directory must be readable where they run),
and ``resume`` onto the farm's resume at the next version. TRL versions and the farm's move together;
``update_model_version`` learns the offset between them.
"""

from __future__ import annotations

import itertools
import json
import logging
import queue
import threading
import time
import warnings
from collections import Counter, deque
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np

from farm.bridges.samples import TrainingSequence, group_advantages, to_sequences
from farm.bridges.trl_weights import FarmWeightTransfer
from farm.client import FarmClient
from farm.errors import SampleFailed
from farm.schemas import JobResult
from farm.schemas.trials import TrialHistory

if TYPE_CHECKING:
    from trl.experimental.async_grpo.async_rollout_worker import RolloutSample

log = logging.getLogger(__name__)

DEFAULT_MAX_RETRIES = 2
#: how long a blocked put or an idle feeder sleeps before it looks at ``stop`` again.
POLL_S = 0.2

__all__ = ["FarmRolloutWorker", "FarmWeightTransfer", "GroupSamples", "Ledger", "LedgerQueue", "farm_task"]

TaskOf = Callable[[Mapping[str, Any]], Mapping[str, Any]]


def farm_task(row: Mapping[str, Any]) -> dict[str, Any]:
    """The farm task a dataset row names: its ``farm_task`` column, ``{type, config}``.

    Raises:
        ValueError: the row names none.
    """
    task = row.get("farm_task")
    if isinstance(task, str):
        task = json.loads(task)
    if not isinstance(task, Mapping) or "type" not in task:
        raise ValueError("the dataset row has no farm task: give it a farm_task column, {type, config}")
    return {"type": task["type"], "config": dict(task.get("config") or {})}


@dataclass
class GroupSamples:
    """A finished group as TRL samples, with each sample's farm job."""

    samples: list[RolloutSample]
    job_ids: list[int]
    #: jobs without a reward (infrastructure failures: left out, never scored 0).
    failed: int


def rollout_samples(
    results: Iterable[JobResult],
    *,
    version_offset: int,
    current_version: int,
    prompt: list[dict[str, Any]] | None = None,
) -> GroupSamples:
    """A finished group as TRL samples, one per segment of each scored trajectory, and how many of its
    jobs had no reward (infrastructure failures: left out, never scored 0).

    The advantage is the trajectory's reward against the group's scored ones, stamped on every row
    of that trajectory (as TRL's own worker does for a conversation it forks). A row's
    ``model_version`` is the TRL version of the oldest weights that sampled it (``current_version``
    when no model sampled any of it)."""
    # TRL's package imports its trainer (torch, accelerate, datasets): only when a group is made. Its
    # warning that trl.experimental is unstable says what this module's docstring already does.
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="You are importing from 'trl.experimental'")
        from trl.experimental.async_grpo.async_rollout_worker import RolloutSample

    scored: list[list[TrainingSequence]] = []
    failed = 0
    for result in results:
        try:
            scored.append(to_sequences(result))
        except SampleFailed:
            failed += 1
    rewards = [rows[-1].reward for rows in scored]
    advantages = group_advantages(rewards)
    spread = float(np.std(rewards)) if rewards else float("nan")
    now = time.time()
    out = GroupSamples(samples=[], job_ids=[], failed=failed)
    for rows, advantage in zip(scored, advantages, strict=True):
        for row in rows:
            version = current_version if row.oldest_version is None else row.oldest_version + version_offset
            out.job_ids.append(row.job_id)
            out.samples.append(
                RolloutSample(
                    prompt=list(prompt or []),
                    completion=[],
                    input_ids=row.input_ids,
                    completion_mask=row.completion_mask,
                    old_log_probs=row.old_log_probs,
                    advantage=float(advantage),
                    model_version=version,
                    group_id=row.group_id,
                    metrics={"reward": row.reward, "reward_std": spread, "farm/segments": float(row.segments)},
                    enqueued_at=now,
                )
            )
    return out


class LedgerQueue(queue.Queue[Any]):
    """The trainer's buffer, telling the worker what the trainer took (``on_take``): with the worker's
    ledger every sample is accounted for (taken, still buffered, or never made)."""

    def __init__(self, maxsize: int = 0, *, on_take: Callable[[RolloutSample], None] | None = None) -> None:
        super().__init__(maxsize)
        self.taken = 0
        self._on_take = on_take

    def get(self, block: bool = True, timeout: float | None = None) -> RolloutSample:
        item = super().get(block, timeout)
        self.taken += 1
        if self._on_take is not None:
            self._on_take(item)
        return item


@dataclass
class Ledger:
    """What the worker asked of the farm and what it handed on, per job."""

    submitted: set[int] = field(default_factory=set)
    #: results seen per job (a result stream yields each job once: more is a duplicate).
    seen: Counter[int] = field(default_factory=Counter)
    #: jobs whose group was handed on (scored jobs of every finished group not submitted again).
    owed: set[int] = field(default_factory=set)
    #: samples put on the buffer per job (one per segment).
    emitted: Counter[int] = field(default_factory=Counter)
    #: owed jobs whose samples were not put because the trainer stopped first.
    unsent_at_stop: set[int] = field(default_factory=set)
    failed_jobs: int = 0
    retried_groups: int = 0
    #: samples the trainer took already more than ``max_staleness`` versions old (it drops them).
    taken_stale: int = 0
    #: the version of each sample the trainer kept, in the order it took them (its batches' order).
    kept_versions: list[int] = field(default_factory=list)
    #: jobs of batches cancelled at ``stop`` (never finished: not lost).
    cancelled_jobs: int = 0

    def lost(self, *, taken: int, buffered: int) -> int:
        """Samples that should have reached the trainer and did not: owed jobs with no sample (the
        trainer stopping first aside), and samples put that it neither took nor holds."""
        missing = len(self.owed - set(self.emitted) - self.unsent_at_stop)
        return missing + (sum(self.emitted.values()) - taken - buffered)

    def duplicated(self) -> int:
        """Jobs the results streams yielded more than once (a job seen once puts each segment once)."""
        return sum(n - 1 for n in self.seen.values() if n > 1)


class FarmRolloutWorker:
    """TRL's ``RolloutWorkerProtocol`` over a farm; see the module docstring."""

    def __init__(
        self,
        farm_url: str,
        *,
        token: str | None,
        dataset: Iterable[Mapping[str, Any]],
        num_generations: int,
        sampling: Mapping[str, Any] | None = None,
        samples_per_step: int,
        max_staleness: int = 0,
        lookahead_samples: int | None = None,
        max_inflight_groups: int | None = None,
        groups_per_batch: int | None = None,
        queue_maxsize: int = 0,
        task: TaskOf = farm_task,
        history: TrialHistory | None = None,
        max_retries: int = DEFAULT_MAX_RETRIES,
        client: FarmClient | None = None,
    ) -> None:
        """Raises:
        ValueError: ``num_generations`` below 2 (no group-relative advantage), or batches larger than
            the in-flight bound."""
        if num_generations < 2:
            raise ValueError(f"num_generations must be at least 2 for group-relative advantages, not {num_generations}")
        if samples_per_step < 1 or max_staleness < 0:
            raise ValueError(
                f"samples_per_step ({samples_per_step}) must be >= 1, max_staleness ({max_staleness}) >= 0"
            )
        step_groups = -(-samples_per_step // num_generations)
        max_inflight_groups = max_inflight_groups or step_groups * (max_staleness + 1)
        groups_per_batch = groups_per_batch or min(step_groups, max_inflight_groups)
        if not 1 <= groups_per_batch <= max_inflight_groups:
            raise ValueError(
                f"groups_per_batch ({groups_per_batch}) must be between 1 and "
                f"max_inflight_groups ({max_inflight_groups})"
            )
        self.client = client or FarmClient(farm_url, token=token, timeout_s=120)
        self.rows = list(dataset)
        if not self.rows:
            raise ValueError("the dataset is empty")
        self.num_generations, self.sampling = num_generations, dict(sampling or {})
        self.max_staleness, self.history, self.task = max_staleness, history, task
        self.max_inflight_groups, self.groups_per_batch = max_inflight_groups, groups_per_batch
        self.samples_per_step = samples_per_step
        self.lookahead_samples = samples_per_step if lookahead_samples is None else lookahead_samples
        self.max_retries = max_retries
        self.rollout_buffer: LedgerQueue = LedgerQueue(queue_maxsize, on_take=self._taken)
        self.metrics_queue: queue.Queue[dict[str, float]] = queue.Queue(maxsize=4096)
        self.ledger = Ledger()
        self.model_version = 0
        self._version_offset = 0
        self._inflight = 0
        self._first_version: int | None = None
        self._submitted_samples = 0
        #: samples that will never reach the trainer fresh (failed jobs, stale ones it drops): made again.
        self._shortfall = 0
        self._cond = threading.Condition()
        self._stop = threading.Event()
        self._error: BaseException | None = None
        self._last_finish = time.monotonic()
        self._retries: deque[tuple[int, int]] = deque()  # (row index, tries so far)
        self._order: Iterator[int] = itertools.cycle(range(len(self.rows)))
        self._threads: list[threading.Thread] = []
        self._batches: set[int] = set()

    # ---- RolloutWorkerProtocol -------------------------------------------------------------------------
    def start(self) -> None:
        if self._threads:
            return
        self._last_finish = time.monotonic()
        self._first_version = self.model_version
        self._spawn(self._feed, "farm-trl-feeder")

    def stop(self) -> None:
        self._stop.set()
        with self._cond:
            self._cond.notify_all()
        for batch_id in list(self._batches):
            try:
                status = self.client.cancel(batch_id)
                self.ledger.cancelled_jobs += status.total_jobs - status.finished_jobs
            except Exception as exc:  # the trainer is ending: say it, do not mask its own error
                log.warning("farm batch %s not cancelled: %s", batch_id, exc)
        for thread in self._threads:
            thread.join(timeout=30)
        self.client.close()

    def update_model_version(self, model_version: int) -> None:
        # The farm's newest version is the one TRL's sync just resumed: their difference is constant
        # while every sync goes through the farm.
        self._version_offset = model_version - self.client.weights().version
        self.model_version = model_version
        with self._cond:
            self._cond.notify_all()  # a new version lets the feeder submit the next step's groups

    def check_health(self, stale_after_s: float) -> None:
        """Raises:
        RuntimeError: a stream or the feeder failed, or the farm cannot make progress (what it sees)."""
        if self._error is not None:
            raise RuntimeError(f"the farm rollout worker failed: {self._error}") from self._error
        overview = self.client.overview()
        healthy = [b for b in overview.backends if b.healthy]
        if not healthy:
            raise RuntimeError(f"the farm has no healthy backend ({len(overview.backends)} registered)")
        stages = {stage for worker in overview.workers for stage in worker.stages}
        missing = {"init", "run", "eval"} - {str(s) for s in stages}
        if missing:
            raise RuntimeError(f"the farm has no worker for stage(s) {', '.join(sorted(missing))}")
        idle_s = time.monotonic() - self._last_finish
        if self._inflight and idle_s > stale_after_s:
            ours = [b for b in overview.batches if b.id in self._batches]
            raise RuntimeError(
                f"no farm job of ours finished in {idle_s:.0f}s with {self._inflight} groups out; batches: "
                + "; ".join(f"{b.id} {dict(b.counts)}" for b in ours)
                + f"; queues: {[(q.name, q.length) for q in overview.queues]}"
            )

    # ---- the worker's threads ----------------------------------------------------------------------------
    def _spawn(self, target: Callable[..., None], name: str, *args: Any) -> None:
        def guarded() -> None:
            try:
                target(*args)
            except BaseException as exc:
                if not self._stop.is_set():
                    log.exception("%s failed", name)
                    self._error = exc

        thread = threading.Thread(target=guarded, name=name, daemon=True)
        self._threads.append(thread)
        thread.start()

    def _owed_samples(self) -> int:
        """Samples the trainer can still take fresh: every step up to ``max_staleness`` versions ahead of
        the current one and the micro-batch its data loader reads ahead, plus what was lost to failures
        and staleness, minus what was asked for."""
        first = self.model_version if self._first_version is None else self._first_version
        steps = self.model_version - first + 1 + self.max_staleness
        owed = steps * self.samples_per_step + self.lookahead_samples + self._shortfall
        return owed - self._submitted_samples

    def _room(self) -> int:
        """Groups the feeder may submit now (0: wait)."""
        owed = max(0, self._owed_samples())
        groups = -(-owed // self.num_generations) + len(self._retries)
        return max(0, min(groups, self.groups_per_batch, self.max_inflight_groups - self._inflight))

    def _feed(self) -> None:
        while not self._stop.is_set():
            with self._cond:
                while not (room := self._room()) and not self._stop.is_set():
                    self._cond.wait(POLL_S)
                if self._stop.is_set():
                    return
                picks = [self._next_pick() for _ in range(room)]
                self._inflight += room
                self._submitted_samples += sum(self.num_generations for index, tries in picks if tries == 0)
            batch = self.client.submit(
                [self.task(self.rows[index]) for index, _ in picks],
                group_size=self.num_generations,
                sampling=self.sampling,
                max_staleness=self.max_staleness,
                history=self.history,
                metadata={"trainer": "trl"},
            )
            self.ledger.submitted.update(batch.job_ids)
            self._batches.add(batch.id)
            self._spawn(self._stream, f"farm-trl-batch-{batch.id}", batch.id, picks)

    def _taken(self, sample: RolloutSample) -> None:
        if self.model_version - sample.model_version > self.max_staleness:
            with self._cond:
                self.ledger.taken_stale += 1
                self._shortfall += 1
                self._cond.notify_all()
        else:
            self.ledger.kept_versions.append(sample.model_version)

    def _next_pick(self) -> tuple[int, int]:
        """A group to retry first, else the dataset's next row (cycled: TRL stops by steps or epochs)."""
        try:
            return self._retries.popleft()
        except IndexError:
            return next(self._order), 0

    def _stream(self, batch_id: int, picks: list[tuple[int, int]]) -> None:
        groups: dict[int, list[JobResult]] = {}
        for result in self.client.results(batch_id):
            if self._stop.is_set():
                return
            job = result.job
            self.ledger.seen[job.id] += 1
            self._last_finish = time.monotonic()
            members = groups.setdefault(job.group_id, [])
            members.append(result)
            if len(members) == self.num_generations:
                self._emit(members, picks[job.group_index])
        self._batches.discard(batch_id)

    def _emit(self, members: list[JobResult], pick: tuple[int, int]) -> None:
        index, tries = pick
        row = self.rows[index]
        prompt = row.get("prompt") if isinstance(row.get("prompt"), list) else None
        group = rollout_samples(
            members, version_offset=self._version_offset, current_version=self.model_version, prompt=prompt
        )
        self.ledger.failed_jobs += group.failed
        if group.failed:
            self._metric({"farm/failed_jobs_total": float(group.failed)})
        if len(members) - group.failed < 2:
            if tries >= self.max_retries:
                raise RuntimeError(
                    f"farm group {members[0].job.group_id} (dataset row {index}) had fewer than two scored samples "
                    f"{tries + 1} times: {members[0].job.reason or members[0].job.outcome}"
                )
            self.ledger.retried_groups += 1
            self._retries.append((index, tries + 1))  # submitted again, outside the budget: it replaces this one
            group.samples, group.job_ids = [], []
        elif group.failed:
            with self._cond:
                self._shortfall += group.failed  # the step still needs that many samples
        self.ledger.owed.update(group.job_ids)
        for sample, job_id in zip(group.samples, group.job_ids, strict=True):
            while True:
                if self._stop.is_set():
                    self.ledger.unsent_at_stop.add(job_id)
                    break
                try:
                    self.rollout_buffer.put(sample, timeout=POLL_S)
                    self.ledger.emitted[job_id] += 1
                    break
                except queue.Full:
                    continue
        with self._cond:
            self._inflight -= 1
            self._cond.notify_all()

    def _metric(self, values: dict[str, float]) -> None:
        try:
            self.metrics_queue.put_nowait(values)
        except queue.Full:
            pass  # a trainer that stops reading metrics must never block rollouts
