"""Testing a task handler without a farm: a scripted LLM at the handler seam, and a
one-process runner of a handler's stages as the pipeline calls them.

The handler runs with whatever sandboxes it is given (real ones from
``farm.worker.sandboxes.SandboxResources``, say) and only the model is replaced by turns
written in advance, tokenized with the policy's tokenizer::

    from farm.testing import run_stages
    done = run_stages(MyHandler(), {"prompt": "..."}, ["<tool_call>...</tool_call>", "done"],
                      sandboxes=sandboxes, tokenizer=tokenizer)
    assert done.eval is not None and done.eval.reward == 1.0
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from typing import Any

from farm.config import ProxySettings
from farm.constants import Stage
from farm.handlers.base import Sandboxes, StageContext, TaskHandler
from farm.llm.types import FinishReason, GenerateResult, SamplingParams
from farm.proxy.parsers import ParserNames, choose
from farm.schemas import EvalResult, RunResult
from farm.schemas.trials import DEFAULT_HISTORY, TrialHistory


class ScriptedLLM:
    """Answers turn i with ``turns[i]`` (the last one repeated), tokenized with the policy's tokenizer."""

    def __init__(self, tokenizer: Any, turns: list[str]) -> None:
        self.tokenizer = tokenizer
        self.turns = turns
        self.prompts: list[list[int]] = []
        self.moves: list[tuple[str, str]] = []
        self.backend_id: str | None = "scripted"
        self.aborted_turns = 0
        self.paused_s = 0.0

    async def generate(self, prompt_ids: list[int], sampling: SamplingParams | None = None) -> GenerateResult:
        text = self.turns[min(len(self.prompts), len(self.turns) - 1)]
        self.prompts.append(list(prompt_ids))
        ids = self.tokenizer.encode(text, add_special_tokens=False) + [self.tokenizer.eos_token_id]
        limit = sampling.max_tokens if sampling is not None else len(ids)
        reason = FinishReason.STOP if len(ids) <= limit else FinishReason.LENGTH
        ids = ids[:limit]
        return GenerateResult(
            token_ids=ids,
            logprobs=[-0.5] * len(ids),
            finish_reason=reason,
            prompt_tokens=len(prompt_ids),
            backend_id="scripted",
            weight_versions=[(0, 0, len(ids))] if ids else [],
        )


@dataclass
class ScriptedResources:
    """Stands in for the worker's ``LLMResources``."""

    tokenizer: Any
    turns: list[str]
    llm: ScriptedLLM | None = None
    released: list[int] = field(default_factory=list)

    @property
    def parsers(self) -> ParserNames:
        """As the worker chooses them with default settings: the family whose template the tokenizer carries."""
        return choose(ProxySettings(), getattr(self.tokenizer, "chat_template", None))

    @asynccontextmanager
    async def _session(self) -> AsyncIterator[ScriptedLLM]:
        assert self.llm is not None
        yield self.llm

    def session(self, job_id: int) -> Any:
        self.llm = ScriptedLLM(self.tokenizer, self.turns)
        return self._session()

    def release(self, job_id: int) -> None:
        self.released.append(job_id)


@dataclass
class StagesRun:
    """What each stage of one job returned, and the scripted LLM that served it."""

    init_state: dict[str, Any]
    run: RunResult
    eval: EvalResult | None
    llm: ScriptedLLM


def stage_context(
    stage: Stage,
    llm: ScriptedResources,
    sandboxes: Sandboxes,
    *,
    attempt: int = 1,
    job_id: int = 1,
    history: TrialHistory = DEFAULT_HISTORY,
) -> StageContext:
    return StageContext(
        job_id=job_id,
        batch_id=1,
        stage=stage,
        attempt=attempt,
        node="test",
        sampling=SamplingParams(max_tokens=2000, temperature=1.0),
        seed=0,
        deadline=time.monotonic() + 120,
        history=history,
        llm=llm,
        sandboxes=sandboxes,
    )


def run_stages(
    handler: TaskHandler[Any, Any],
    config: dict[str, Any],
    turns: list[str],
    *,
    sandboxes: Any,
    tokenizer: Any,
    history: TrialHistory = DEFAULT_HISTORY,
) -> StagesRun:
    """INIT, RUN, EVAL (when RUN's outcome is scored) and teardown, as the pipeline calls them;
    ``history`` is the batch's history policy."""
    from farm.constants import POLICY_OUTCOMES

    llm = ScriptedResources(tokenizer=tokenizer, turns=turns)
    cfg = handler.validate(config)
    state = asyncio.run(handler.init(cfg, stage_context(Stage.INIT, llm, sandboxes)))
    evaluated = None
    try:
        run = asyncio.run(handler.run(cfg, state, stage_context(Stage.RUN, llm, sandboxes, history=history)))
        state = state.updated(run.state)
        if run.outcome in POLICY_OUTCOMES:
            evaluated = asyncio.run(
                handler.evaluate(cfg, state, run.trajectory, stage_context(Stage.EVAL, llm, sandboxes))
            )
    finally:
        asyncio.run(handler.teardown(cfg, state, stage_context(Stage.EVAL, llm, sandboxes)))
    assert llm.llm is not None
    return StagesRun(init_state=handler.stored_state(state), run=run, eval=evaluated, llm=llm.llm)
