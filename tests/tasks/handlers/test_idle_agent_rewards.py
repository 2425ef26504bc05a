"""Rewards that cannot be had for nothing: every shipped task of every task type scores 0 for an
agent that does nothing (an empty reply: no answer, no tool call, the workspace as INIT left it),
with the real handlers, sandboxes and graders. A harness that does nothing is graded by its inner
task's grader on the untouched sandbox."""

from __future__ import annotations

import asyncio
import sys
from pathlib import Path
from typing import Any

import pytest

from farm.constants import Stage
from farm.handlers.registry import get_handler
from farm.schemas.stages import TrajectoryData
from farm.testing import run_stages
from farm.testing.handlers import ScriptedResources, stage_context
from tasks.code.dataset import shipped as shipped_code
from tasks.code.grader import grade as grade_code
from tasks.harbor.dataset import shipped as shipped_harbor
from tasks.math.dataset import shipped as shipped_math
from tasks.math.grader import grade as grade_math
from tasks.swe.dataset import shipped as shipped_swe

#: an agent that does nothing: one empty reply ends its episode.
NOTHING = [""]


def _ids(items: list[dict[str, Any]]) -> list[str]:
    return [str(item["id"]) for item in items]


def test_math_empty_answer_scores_zero_on_every_shipped_problem():
    # The grader alone for all of them (a reply without an answer), then one through the handler below.
    from tasks.math.dataset import problems_by_id

    for item in shipped_math():
        problem = problems_by_id()[item["config"]["problem_id"]]
        for reply in ("", " ", "\\boxed{}"):
            reward, info = grade_math(reply, problem.answer)
            assert reward == 0.0, (item["id"], reply, info)


def test_code_no_solution_scores_zero_on_every_shipped_problem(tmp_path: Path):
    # Partial credit (``fraction``) is the mode that could pay something; 0 there is 0 in ``all``.
    from tasks.code.dataset import problems_by_id

    for item in shipped_code():
        problem = problems_by_id()[item["config"]["problem_id"]]
        workdir = tmp_path / item["id"]
        workdir.mkdir()
        result = grade_code(problem=problem, solution="", workdir=workdir, python=sys.executable, mode="fraction")
        assert result.reward == 0.0, (item["id"], result)


@pytest.mark.parametrize("task_type", ["math", "code"])
def test_answer_tasks_score_zero_for_an_empty_reply(task_type: str, tiny_tokenizer: Any, sandboxes: Any) -> None:
    # Through the handler, RUN's collect and EVAL's sandbox included (one shipped item: the graders
    # of all of them are checked above).
    item = (shipped_math() if task_type == "math" else shipped_code())[0]
    config = {**item["config"], **({"reward": "fraction"} if task_type == "code" else {})}
    out = run_stages(get_handler(task_type), config, NOTHING, sandboxes=sandboxes, tokenizer=tiny_tokenizer)
    assert out.eval is not None, (out.run.outcome, out.run.reason)
    assert out.eval.reward == 0.0, out.eval.info


@pytest.mark.parametrize("item", shipped_swe() + shipped_harbor(), ids=_ids(shipped_swe() + shipped_harbor()))
def test_workspace_tasks_score_zero_when_left_untouched(item: dict[str, Any], tiny_tokenizer: Any, sandboxes: Any):
    task_type = "swe" if "instance_id" in item["config"] else "harbor"
    out = run_stages(get_handler(task_type), item["config"], NOTHING, sandboxes=sandboxes, tokenizer=tiny_tokenizer)
    assert out.eval is not None, (out.run.outcome, out.run.reason)
    assert out.eval.reward == 0.0, out.eval.info


@pytest.mark.parametrize("item", shipped_swe() + shipped_harbor(), ids=_ids(shipped_swe() + shipped_harbor()))
def test_harness_that_does_nothing_scores_zero(item: dict[str, Any], tiny_tokenizer: Any, sandboxes: Any):
    # What a harness's EVAL scores: the inner task's grader on what collect() took from the sandbox
    # the harness ran in; here it ran nothing (`preset: command`, `true`).
    task_type = "swe" if "instance_id" in item["config"] else "harbor"
    inner: Any = get_handler(task_type)
    inner_config = inner.validate(item["config"])
    harness = get_handler("harness")
    config = harness.validate(
        {"task": {"type": task_type, "config": item["config"]}, "harness": {"preset": "command", "command": ["true"]}}
    )
    llm = ScriptedResources(tokenizer=tiny_tokenizer, turns=[])
    state = asyncio.run(inner.init(inner_config, stage_context(Stage.INIT, llm, sandboxes)))
    try:
        sandbox = sandboxes.attach(state.stored()["sandbox"])
        try:
            from tasks.harness.handler import _episode

            collected = inner.collect(inner_config, state, sandbox, _episode())
        finally:
            sandbox.detach()
        state = harness.load_state({**state.stored(), **collected})
        empty = TrajectoryData(token_ids=[], logprobs=[], loss_mask=[])
        scored = asyncio.run(harness.evaluate(config, state, empty, stage_context(Stage.EVAL, llm, sandboxes)))
    finally:
        asyncio.run(
            inner.teardown(inner_config, inner.load_state(state.stored()), stage_context(Stage.EVAL, llm, sandboxes))
        )
    assert scored.reward == 0.0, scored.info
