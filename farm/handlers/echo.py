"""``echo``: the built-in handler that proves the pipeline without a model or sandbox.

INIT turns the text into byte-level token ids; RUN "samples" the text back (reversed if
asked) with a seeded per-character corruption rate, producing a trajectory with a
prompt (loss mask 0) and a response (loss mask 1); EVAL scores the characters of the response
that match the target, over the longer of the two (extra characters count against it). Optional
per-stage sleeps make it a stand-in for real stage costs in benchmarks, ``fail_attempts``
simulates infrastructure faults for retry tests, and ``success_rate`` makes the reward a seeded coin
(a prompt of known difficulty, for dynamic sampling).
"""

from __future__ import annotations

import asyncio
import math
import random
import time

from pydantic import BaseModel, ConfigDict, Field

from farm.constants import Outcome, Stage
from farm.errors import SandboxError
from farm.handlers.base import HandlerState, StageContext, TaskHandler
from farm.schemas import EvalResult, RunResult, TrajectoryData

#: ids 0..3 are reserved (pad, bos, eos, sep) so byte b is token b + 4.
BYTE_OFFSET = 4
BOS_ID, EOS_ID, SEP_ID = 1, 2, 3
#: how often a sleeping stage looks at the cancel flag.
CANCEL_POLL_S = 0.05


class StageSleeps(BaseModel):
    model_config = ConfigDict(extra="forbid")

    init: float = Field(default=0.0, ge=0, le=600)
    run: float = Field(default=0.0, ge=0, le=600)
    eval: float = Field(default=0.0, ge=0, le=600)


class EchoConfig(BaseModel):
    model_config = ConfigDict(extra="forbid")

    text: str = Field(min_length=1, max_length=100_000)
    reverse: bool = False
    #: probability that the "model" corrupts each character; gives groups varied rewards.
    noise: float = Field(default=0.0, ge=0.0, le=1.0)
    sleep_s: StageSleeps = Field(default_factory=StageSleeps)
    #: raise an infrastructure error on the first N attempts of this stage (retry tests).
    fail_stage: Stage | None = None
    fail_attempts: int = Field(default=0, ge=0, le=100)
    #: when set, the reward is 1 with this probability (seeded by the job's seed) and 0 otherwise,
    #: instead of the share of matching characters: a prompt's "difficulty", for dynamic sampling.
    success_rate: float | None = Field(default=None, ge=0.0, le=1.0)


class EchoState(HandlerState):
    """INIT's prompt, and the text RUN aimed at (what EVAL compares the reply with)."""

    prompt_ids: list[int] = []
    target: str = ""


def _encode(text: str) -> list[int]:
    return [b + BYTE_OFFSET for b in text.encode("utf-8")]


def _decode(ids: list[int]) -> str:
    return bytes(i - BYTE_OFFSET for i in ids if i >= BYTE_OFFSET).decode("utf-8", errors="replace")


async def _sleep(seconds: float, ctx: StageContext) -> bool:
    """Sleep, waking early on cancel; True when cancelled."""
    end = time.monotonic() + seconds
    while (left := end - time.monotonic()) > 0:
        if ctx.is_cancelled():
            return True
        await asyncio.sleep(min(left, CANCEL_POLL_S))
    return ctx.is_cancelled()


class EchoHandler(TaskHandler[EchoConfig, EchoState]):
    """Echoes its text back; see the module docstring."""

    config_class = EchoConfig
    state_class = EchoState
    reverify_safe = True

    def _maybe_fail(self, config: EchoConfig, ctx: StageContext) -> None:
        if config.fail_stage is ctx.stage and ctx.attempt <= config.fail_attempts:
            raise SandboxError(f"simulated {ctx.stage.value} failure, attempt {ctx.attempt}", job_id=ctx.job_id)

    async def init(self, config: EchoConfig, ctx: StageContext) -> EchoState:
        self._maybe_fail(config, ctx)
        await _sleep(config.sleep_s.init, ctx)
        return EchoState(prompt_ids=[BOS_ID, *_encode(config.text), SEP_ID])

    async def run(self, config: EchoConfig, state: EchoState, ctx: StageContext) -> RunResult:
        self._maybe_fail(config, ctx)
        prompt = state.prompt_ids
        if await _sleep(config.sleep_s.run, ctx):
            return RunResult(
                trajectory=TrajectoryData(token_ids=prompt, logprobs=[0.0] * len(prompt), loss_mask=[0] * len(prompt)),
                outcome=Outcome.CANCELLED,
                reason="batch cancelled during RUN",
            )
        rng = random.Random(ctx.seed)
        target = config.text[::-1] if config.reverse else config.text
        chars = [chr(rng.randrange(97, 123)) if rng.random() < config.noise else c for c in target]
        response = [*_encode("".join(chars)), EOS_ID]
        # A plausible logprob per sampled token: log(1 - noise) for kept, log(noise/26) for changed.
        keep = math.log(max(1.0 - config.noise, 1e-6))
        logprobs = [keep] * len(response)
        trajectory = TrajectoryData(
            token_ids=[*prompt, *response],
            logprobs=[0.0] * len(prompt) + logprobs,
            loss_mask=[0] * len(prompt) + [1] * len(response),
            turn_offsets=[0, len(prompt)],
        )
        return RunResult(trajectory=trajectory, state=EchoState(target=target).stored())

    async def evaluate(
        self, config: EchoConfig, state: EchoState, trajectory: TrajectoryData, ctx: StageContext
    ) -> EvalResult:
        self._maybe_fail(config, ctx)
        await _sleep(config.sleep_s.eval, ctx)
        if config.success_rate is not None:
            solved = random.Random(f"{ctx.seed}:success").random() < config.success_rate
            return EvalResult(reward=float(solved), metrics={"exact": float(solved)})
        response = [t for t, m in zip(trajectory.token_ids, trajectory.loss_mask, strict=True) if m and t != EOS_ID]
        got, want = _decode(response), state.target
        matches = sum(a == b for a, b in zip(got, want, strict=False))
        # Over the longer of the two: characters past the target are wrong, not free.
        score = matches / max(len(want), len(got), 1)
        return EvalResult(reward=score, metrics={"exact": float(got == want), "chars": float(len(want))})
