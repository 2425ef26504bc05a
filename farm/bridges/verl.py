"""verl's agent loop with every sample's rollout run by the farm (verl >= 0.9: ``AgentLoopBase``).

verl calls ``run`` once per sample (the n samples of a prompt are n calls, made concurrently by its
agent loop worker). The loop hands the sample's task to the farm and returns verl's own
``AgentLoopOutput``: the prompt, the response (model turns with mask 1 and the logprobs the backend
sampled them with; tool results and generation prompts between them with mask 0), the reward, the
number of turns, and the farm's facts in ``extra_fields`` (job id, outcome, weight versions).

Configuration, in the file verl reads at ``actor_rollout_ref.rollout.agent.agent_loop_config_path``::

    - name: farm
      _target_: farm.bridges.verl.FarmAgentLoop
      farm_url: http://farm:8700
      farm_token_file: /secrets/farm-token      # or farm_token: ...

and each dataset row names the loop and its task: ``agent_name: farm`` and
``extra_info: {farm_task: {type: math, config: {problem_id: ...}}}`` (docs/verl.md).

Samples that arrive within ``batch_window_s`` of each other go to the farm as one batch (one submit,
one results stream), not one batch each.

``history`` is the farm batches' history policy (unset: the farm's default, ``exact``, one segment
per episode). Under ``template`` an episode whose chat template rewrites earlier turns has several
segments, each a token sequence with its own prompt, and verl's ``AgentLoopOutput`` holds one.
``segments`` says what the loop returns then: ``main`` (the default) the main segment alone (the
episode's last conversation; ``extra_fields.farm_segments`` counts them all, and a warning says
the others were left out), ``all`` a list of outputs, one per segment, the main one last, each with
the reward. Only verl's TransferQueue trainer (``verl.trainer.ppo.v1``) takes a list from an agent
loop: it scores the last output, computes GRPO advantages from it and broadcasts them to the others.

A job that ends without a reward (an infrastructure failure) is submitted again up to ``max_retries``
times, then raises: it is never handed to verl as a reward of 0.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from pathlib import Path
from typing import Any, Literal

from verl.experimental.agent_loop.agent_loop import AgentLoopBase, AgentLoopMetrics, AgentLoopOutput, register

from farm.bridges.samples import Sample, to_samples
from farm.client import AsyncFarmClient
from farm.errors import SampleFailed
from farm.schemas import JobResult
from farm.schemas.trials import HISTORY_POLICIES, TrialHistory

log = logging.getLogger(__name__)

#: samples arriving this close together share one farm batch.
DEFAULT_BATCH_WINDOW_S = 0.05
DEFAULT_MAX_RETRIES = 2
#: verl's sampling parameters the farm understands, by verl's name.
SAMPLING_KEYS = ("temperature", "top_p", "top_k", "seed")


class _Collector:
    """Gathers the samples of one event loop into farm batches and hands each its result."""

    def __init__(self, url: str, token: str | None, window_s: float) -> None:
        self.client = AsyncFarmClient(url, token=token, timeout_s=120)
        self.window_s = window_s
        self._pending: dict[str, list[tuple[dict[str, Any], asyncio.Future[JobResult]]]] = {}

    async def run(self, task: dict[str, Any], sampling: dict[str, Any], history: TrialHistory | None) -> JobResult:
        key = json.dumps([sampling, history], sort_keys=True)
        future: asyncio.Future[JobResult] = asyncio.get_running_loop().create_future()
        waiting = self._pending.setdefault(key, [])
        waiting.append((task, future))
        if len(waiting) == 1:
            asyncio.get_running_loop().call_later(self.window_s, lambda: asyncio.ensure_future(self._flush(key)))
        return await future

    async def _flush(self, key: str) -> None:
        waiting = self._pending.pop(key, [])
        if not waiting:
            return
        try:
            sampling, history = json.loads(key)
            batch = await self.client.submit([task for task, _ in waiting], sampling=sampling, history=history)
            by_job = dict(zip(batch.job_ids, (future for _, future in waiting), strict=True))
            async for result in self.client.results(batch.id):
                future = by_job.get(result.job.id)
                if future is not None and not future.done():
                    future.set_result(result)
        except Exception as exc:  # every sample of the batch learns why
            for _, future in waiting:
                if not future.done():
                    future.set_exception(exc)


_collectors: dict[tuple[int, str, str | None], _Collector] = {}


def _collector(url: str, token: str | None, window_s: float) -> _Collector:
    """One per event loop and farm: verl makes a new agent loop object for every sample."""
    key = (id(asyncio.get_running_loop()), url, token)
    if key not in _collectors:
        _collectors[key] = _Collector(url, token, window_s)
    return _collectors[key]


def task_of(kwargs: dict[str, Any]) -> dict[str, Any]:
    """The farm task a dataset row names (``extra_info.farm_task``, or a ``farm_task`` field).

    Raises:
        ValueError: the row names none.
    """
    extra = kwargs.get("extra_info") or {}
    task = extra.get("farm_task") if isinstance(extra, dict) else None
    task = task or kwargs.get("farm_task")
    if not isinstance(task, dict) or "type" not in task:
        raise ValueError("the dataset row has no farm task: give extra_info.farm_task = {type, config}")
    return {"type": task["type"], "config": dict(task.get("config") or {})}


@register("farm")
class FarmAgentLoop(AgentLoopBase):
    """An agent loop whose rollouts the farm runs; see the module docstring."""

    def __init__(
        self,
        *args: Any,
        farm_url: str,
        farm_token: str | None = None,
        farm_token_file: str | None = None,
        batch_window_s: float = DEFAULT_BATCH_WINDOW_S,
        max_retries: int = DEFAULT_MAX_RETRIES,
        history: TrialHistory | None = None,
        segments: Literal["main", "all"] = "main",
        **kwargs: Any,
    ) -> None:
        """Raises:
        ValueError: an unknown ``history`` or ``segments``."""
        if history is not None and history not in HISTORY_POLICIES:
            raise ValueError(f"history must be one of {', '.join(HISTORY_POLICIES)}, not {history!r}")
        if segments not in ("main", "all"):
            raise ValueError(f"segments must be 'main' or 'all', not {segments!r}")
        super().__init__(*args, **kwargs)
        self.history, self.segments = history, segments
        if farm_token is None and farm_token_file is not None:
            farm_token = Path(farm_token_file).read_text().strip()
        self.farm_url, self.farm_token = farm_url, farm_token
        self.batch_window_s, self.max_retries = batch_window_s, max_retries

    async def run(self, sampling_params: dict[str, Any], **kwargs: Any) -> AgentLoopOutput | list[AgentLoopOutput]:
        task = task_of(kwargs)
        response_length = int(self.rollout_config.response_length)
        sampling = {k: sampling_params[k] for k in SAMPLING_KEYS if sampling_params.get(k) is not None}
        if sampling.get("top_k") == 0:
            sampling["top_k"] = -1  # verl's "off"; the farm's is -1
        sampling["max_tokens"] = response_length
        collector = _collector(self.farm_url, self.farm_token, self.batch_window_s)
        started = time.monotonic()
        for attempt in range(self.max_retries + 1):
            result = await collector.run(task, sampling, self.history)
            try:
                samples = to_samples(result, max_response_tokens=response_length, segments=self.segments)
                break
            except SampleFailed:
                if attempt == self.max_retries:
                    raise
        if self.segments == "main" and (count := samples[0].extra["farm_segments"]) > 1:
            log.warning(
                "farm job %s has %d segments (history 'template'); verl gets its main segment only: "
                "set segments: all (verl's TransferQueue trainer) or history: exact to train on every token",
                result.job.id,
                count,
            )
        metrics = AgentLoopMetrics(generate_sequences=time.monotonic() - started)
        outputs = [self._output(sample, metrics) for sample in samples]
        return outputs if self.segments == "all" else outputs[0]

    def _output(self, sample: Sample, metrics: AgentLoopMetrics) -> AgentLoopOutput:
        return AgentLoopOutput(
            prompt_ids=self._cap_text_prompt_length(sample.prompt_ids),
            response_ids=sample.response_ids,
            response_mask=sample.response_mask,
            response_logprobs=sample.response_logprobs,
            reward_score=sample.reward,
            num_turns=sample.num_turns,
            metrics=metrics,
            extra_fields=sample.extra,
        )
