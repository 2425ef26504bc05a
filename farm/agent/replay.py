"""Replaying a finished episode without the model: its recorded tool calls, in order, in a fresh sandbox.

A job of an :class:`~farm.agent.handler.AgentHandler` keeps what its agent did in its RUN state
(:mod:`farm.agent.record`). :func:`replay` makes a sandbox the way INIT made the job's (the
handler's own ``init``), runs every recorded call in it with its recorded arguments, compares each
observation with the recorded one, then lets the handler take out what EVAL needs (``collect``,
with the recorded final answer) and score it (``evaluate``). An observation or a reward that
comes out differently points at a task that is not deterministic, or a grader that depends on
something besides the agent's work.

Nothing here asks a model: the context's ``llm`` is only asked to release a slot it never held.
"""

from __future__ import annotations

import asyncio
import dataclasses
from dataclasses import dataclass, field
from typing import Any

from farm.agent.handler import AgentHandler, AgentState
from farm.agent.loop import Episode, observation
from farm.agent.record import ACTIONS_KEY, digest, keep
from farm.agent.toolbox import SandboxToolbox
from farm.constants import Outcome, Stage
from farm.db.stored import StoredJob
from farm.errors import NotReplayable
from farm.handlers.base import StageContext
from farm.llm.trajectory import TokenTrajectory
from farm.schemas import TrajectoryData


@dataclass(frozen=True)
class RecordedRun(StoredJob):
    """What a finished job stored (its config, its RUN state with the actions, its score) and its trajectory."""

    trajectory: TrajectoryData | None = None


@dataclass(frozen=True)
class LineDifference:
    """The first line (1-based) where two observations part; None on the side that has no such line."""

    line: int
    recorded: str | None
    replayed: str | None


@dataclass(frozen=True)
class StepReplay:
    """One recorded tool call run again. ``recorded`` is None where the record kept only a hash."""

    index: int
    turn: int
    tool: str
    arguments: dict[str, Any]
    same: bool
    recorded: str | None
    replayed: str
    first_difference: LineDifference | None = None


@dataclass
class ReplayReport:
    """Every step replayed, and the reward scored again (None when the job was never scored)."""

    job_id: int
    type: str
    steps: list[StepReplay] = field(default_factory=list)
    recorded_reward: float | None = None
    replayed_reward: float | None = None

    @property
    def differing(self) -> list[StepReplay]:
        return [step for step in self.steps if not step.same]

    @property
    def reward_same(self) -> bool:
        return self.recorded_reward == self.replayed_reward

    @property
    def reproduced(self) -> bool:
        return not self.differing and self.reward_same

    def to_dict(self) -> dict[str, Any]:
        return {
            "job_id": self.job_id,
            "type": self.type,
            "reproduced": self.reproduced,
            "recorded_reward": self.recorded_reward,
            "replayed_reward": self.replayed_reward,
            "steps": [dataclasses.asdict(step) for step in self.steps],
        }


def first_difference(recorded: str, replayed: str) -> LineDifference | None:
    """Where two texts first differ, line by line; None when they have the same lines."""
    old, new = recorded.splitlines(), replayed.splitlines()
    for number in range(1, max(len(old), len(new)) + 1):
        a = old[number - 1] if number <= len(old) else None
        b = new[number - 1] if number <= len(new) else None
        if a != b:
            return LineDifference(number, a, b)
    return None


def compare_step(index: int, step: dict[str, Any], replayed: str) -> StepReplay:
    """A recorded step against the observation its call gave now (compared whole, by hash)."""
    recorded = step.get("observation")
    same = digest(replayed) == step.get("sha256")
    shown = keep(replayed)
    where = None
    if not same and isinstance(recorded, str):
        # Both sides cut the same way: a difference only in a part not recorded finds no line here.
        where = first_difference(recorded, shown)
    return StepReplay(
        index=index,
        turn=int(step.get("turn", 0)),
        tool=str(step["tool"]),
        arguments=dict(step["arguments"]),
        same=same,
        recorded=recorded if isinstance(recorded, str) else None,
        replayed=shown,
        first_difference=where,
    )


def recorded_steps(run: RecordedRun) -> list[dict[str, Any]]:
    """The run's action record.

    Raises:
        NotReplayable: the job's RUN state has none.
    """
    steps = run.state.get(ACTIONS_KEY)
    if not isinstance(steps, list):
        raise NotReplayable(
            f"job {run.job_id} ({run.type}) has no recorded actions: only agent tasks record them, "
            "and only when RUN finished with this version of the farm",
            job_id=run.job_id,
        )
    return steps


async def replay(handler: AgentHandler[Any], config: Any, run: RecordedRun, ctx: StageContext) -> ReplayReport:
    """Replay ``run`` (see the module docstring); ``ctx`` gives the sandboxes of this machine.

    Raises:
        NotReplayable: no action record.
        SandboxError: the sandbox could not be made or broke (not a difference: nothing was compared).
    """
    steps = recorded_steps(run)
    report = ReplayReport(job_id=run.job_id, type=run.type, recorded_reward=run.reward)
    state = await handler.init(config, dataclasses.replace(ctx, stage=Stage.INIT))
    try:
        report.steps, collected = await asyncio.to_thread(_in_sandbox, handler, config, run, state, steps, ctx)
        if run.reward is not None and run.trajectory is not None:
            # EVAL's state as RUN would have left it, with the answer the model gave.
            eval_state = state.updated({**collected, "final_text": _final_text(run), "submitted": _submitted(run)})
            eval_ctx = dataclasses.replace(ctx, stage=Stage.EVAL)
            scored = await handler.evaluate(config, eval_state, run.trajectory, eval_ctx)
            report.replayed_reward = float(scored.reward)
    finally:
        await handler.teardown(config, state, ctx)
    return report


def _final_text(run: RecordedRun) -> str:
    return str(run.state.get("final_text", ""))


def _submitted(run: RecordedRun) -> dict[str, Any] | None:
    submitted = run.state.get("submitted")
    return submitted if isinstance(submitted, dict) else None


def _in_sandbox(
    handler: AgentHandler[Any],
    config: Any,
    run: RecordedRun,
    state: AgentState,
    steps: list[dict[str, Any]],
    ctx: StageContext,
) -> tuple[list[StepReplay], dict[str, Any]]:
    """Run the steps in the sandbox ``state`` names and collect from it (blocking)."""
    episode = Episode(
        outcome=run.outcome or Outcome.OK,
        reason=None,
        trajectory=TokenTrajectory(),
        final_text=_final_text(run),
        submitted=_submitted(run),
    )
    if state.sandbox is None:
        if steps:
            raise NotReplayable(f"job {run.job_id} recorded tool calls but its task makes no sandbox now")
        return [], handler.collect(config, state, None, episode)
    sandbox = ctx.sandboxes.attach(state.sandbox)
    try:
        tools = SandboxToolbox(sandbox.tools(), handler.tool_names(config))
        replayed = []
        for index, step in enumerate(steps):
            # No episode clock here: each call gets the timeout it asked for, or the tool's default.
            result = tools.call(str(step["tool"]), dict(step["arguments"]), timeout_s=None)
            replayed.append(compare_step(index, step, observation(result)))
        return replayed, handler.collect(config, state, sandbox, episode)
    finally:
        sandbox.detach()
