"""``generate``: one model turn on a chat prompt, token in and token out.

The smallest handler that uses the LLM layer end to end: the prompt is rendered with the
policy's chat template, one turn is sampled on the job's balancer-chosen backend, and the
trajectory holds exactly the ids and logprobs the backend returned. The reward is 1 when the
reply, stripped, equals ``reference`` (``match="contains"``: when it contains it anywhere, which a
reply listing many candidates games; for smoke tests only), 0 otherwise and when there is none.
``match="charset"`` is a shaped reward for learning demos (``examples/grpo_cpu.py``): the share of
the reply's non-space characters that are among ``reference``'s characters (0 for an empty reply).
Backend failures are infrastructure errors: retried, then reported as ``infra_error``.
"""

from __future__ import annotations

import asyncio
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from farm.constants import Outcome
from farm.errors import Cancelled
from farm.handlers.base import HandlerState, StageContext, TaskHandler
from farm.schemas import EvalResult, RunResult, TrajectoryData


class Message(BaseModel):
    model_config = ConfigDict(extra="forbid")

    role: Literal["system", "user", "assistant"]
    content: str = Field(max_length=200_000)


class GenerateConfig(BaseModel):
    model_config = ConfigDict(extra="forbid")

    messages: list[Message] = Field(min_length=1)
    #: the reply earns reward 1 when it is this text (``match``), stripped of surrounding whitespace.
    reference: str | None = Field(default=None, min_length=1)
    #: ``exact`` (default), ``contains`` (the reference anywhere in the reply: cheap to game), or
    #: ``charset`` (the share of the reply's non-space characters found in the reference: shaped).
    match: Literal["exact", "contains", "charset"] = "exact"
    #: overrides the batch's sampling.max_tokens for this task.
    max_tokens: int | None = Field(default=None, ge=1)


class GenerateState(HandlerState):
    """RUN's reply as text (EVAL scores it)."""

    reply: str = ""


class GenerateHandler(TaskHandler[GenerateConfig, GenerateState]):
    """One sampled turn; see the module docstring."""

    config_class = GenerateConfig
    state_class = GenerateState
    reverify_safe = True  # scores the stored reply

    async def run(self, config: GenerateConfig, state: GenerateState, ctx: StageContext) -> RunResult:
        from farm.llm.trajectory import TrajectoryBuilder

        llm = ctx.llm
        tokenizer = await asyncio.to_thread(lambda: llm.tokenizer)
        messages = [m.model_dump() for m in config.messages]
        builder = await asyncio.to_thread(TrajectoryBuilder, tokenizer=tokenizer, messages=messages)
        sampling = ctx.sampling.model_copy(
            update={"seed": ctx.seed, "max_tokens": config.max_tokens or ctx.sampling.max_tokens}
        )
        from farm.llm.session import until_cancelled

        async with llm.session(ctx.job_id) as session:
            try:
                result = await until_cancelled(session.generate(builder.prompt_ids, sampling), ctx.is_cancelled)
            except Cancelled as exc:
                empty = TrajectoryData(
                    token_ids=builder.prompt_ids,
                    logprobs=[0.0] * len(builder.prompt_ids),
                    loss_mask=[0] * len(builder.prompt_ids),
                )
                return RunResult(trajectory=empty, outcome=Outcome.CANCELLED, reason=str(exc))
        reply = builder.add_completion(result)
        built = builder.build()
        info: dict[str, Any] = {
            "backend": result.backend_id,
            "finish_reason": result.finish_reason.value,
            "moves": [list(move) for move in session.moves],
            "cached_tokens": result.cached_tokens,
        }
        # What weight updates cost this turn: re-issued after an abort, seconds held.
        info.update(
            {k: v for k, v in {"aborted_turns": session.aborted_turns, "paused_s": session.paused_s}.items() if v}
        )
        trajectory = TrajectoryData(
            token_ids=built.token_ids,
            logprobs=built.logprobs,
            loss_mask=built.loss_mask,
            turn_offsets=[span.start for span in built.turns],
            weight_versions=built.weight_versions,
            info=info,
        )
        return RunResult(trajectory=trajectory, state=GenerateState(reply=reply).stored())

    async def evaluate(
        self, config: GenerateConfig, state: GenerateState, trajectory: TrajectoryData, ctx: StageContext
    ) -> EvalResult:
        reply, want = state.reply.strip(), (config.reference or "").strip()
        scored = {"scored": float(config.reference is not None)}
        if config.match == "charset":
            chars = [c for c in reply if not c.isspace()]
            share = sum(c in want for c in chars) / len(chars) if chars and want else 0.0
            return EvalResult(reward=share, metrics=scored)
        hit = bool(want) and (reply == want if config.match == "exact" else want in reply)
        return EvalResult(reward=float(hit), metrics=scored)

    async def teardown(self, config: GenerateConfig, state: GenerateState, ctx: StageContext) -> None:
        # The session releases its backend slot; this covers a RUN that died before it could.
        await asyncio.to_thread(ctx.llm.release, ctx.job_id)
