"""``math``: answer a problem; the reward is 1 when the final answer equals the reference.

With ``max_turns`` 1 (the default) the model answers in one reply, no sandbox. With more turns
it gets a Python kernel in a sandbox to compute with, and answers in a reply without a tool
call (or with ``submit``'s ``answer``). Graded by :func:`tasks.math.grader.grade`: the last
``\\boxed{}`` (or "the answer is ..."), compared as exact fractions or symbolically.
"""

from __future__ import annotations

import asyncio
from typing import Any

from farm.agent.handler import AgentHandler, AgentState
from farm.agent.toolbox import system_prompt
from farm.handlers.base import StageContext
from farm.sandbox.base import SandboxSpec
from farm.schemas import EvalResult, TrajectoryData
from tasks.math.dataset import MathConfig
from tasks.math.grader import grade

SYSTEM = "You are a careful mathematician. Think step by step, then give the final answer as \\boxed{...}."
SYSTEM_WITH_TOOLS = (
    "You are a careful mathematician. You may run Python to compute. When you know the answer, reply "
    "without a tool call and give the final answer as \\boxed{...}."
)


class MathState(AgentState):
    """The answer is the final reply or submit's ``answer`` (``AgentState``'s own fields)."""


class MathHandler(AgentHandler[MathConfig, MathState]):
    config_class = MathConfig
    state_class = MathState
    # The answer is the final reply (or submit's answer), kept in the job's state.
    reverify_safe = True
    answer_in_text = True

    def sandbox_spec(self, config: MathConfig) -> SandboxSpec | None:
        return SandboxSpec() if config.max_turns > 1 else None

    def tool_names(self, config: MathConfig) -> list[str]:
        return ["ipython"]

    def messages(self, config: MathConfig, state: MathState, specs: list[dict[str, Any]]) -> list[dict[str, Any]]:
        system = system_prompt(SYSTEM_WITH_TOOLS, specs) if specs else SYSTEM
        return [{"role": "system", "content": system}, {"role": "user", "content": config.resolve().instruction()}]

    async def evaluate(
        self, config: MathConfig, state: MathState, trajectory: TrajectoryData, ctx: StageContext
    ) -> EvalResult:
        # The symbolic check runs in a child process with its own timeout; keep the loop free meanwhile.
        reward, info = await asyncio.to_thread(grade, self.answer_text(state), config.resolve().answer)
        return EvalResult(reward=reward, metrics={"correct": reward}, info={"grade": info})
