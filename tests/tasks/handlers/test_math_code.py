"""math and code handlers with real sandboxes and tools; the model is scripted (reward 1 and 0 paths)."""

from __future__ import annotations

from typing import Any

import pytest

from farm.agent.toolcalls import format_call
from farm.constants import Outcome
from farm.handlers.registry import get_handler
from farm.testing import run_stages
from tasks.code.dataset import problems_by_id as code_problems
from tasks.math.dataset import problems_by_id as math_problems

FENCE = "`" * 3


def _math_problem() -> Any:
    return next(iter(math_problems().values()))


def test_math_single_turn_right_and_wrong_answers(tiny_tokenizer: Any) -> None:
    problem = _math_problem()
    handler = get_handler("math")
    right = run_stages(
        handler,
        {"problem_id": problem.id},
        [f"Easy: \\boxed{{{problem.answer}}}"],
        sandboxes=None,
        tokenizer=tiny_tokenizer,
    )
    assert right.run.outcome is Outcome.OK
    assert right.eval is not None and right.eval.reward == 1.0
    assert "sandbox" not in right.init_state  # one turn, no tools: no sandbox
    wrong = run_stages(
        handler, {"problem_id": problem.id}, ["\\boxed{-12345}"], sandboxes=None, tokenizer=tiny_tokenizer
    )
    assert wrong.eval is not None and wrong.eval.reward == 0.0
    assert wrong.eval.info["grade"]["extracted"] == "-12345"


def test_math_with_python_tool(tiny_tokenizer: Any, sandboxes: Any) -> None:
    turns = [
        format_call("ipython", {"code": "print(3*4 + 5)"}),
        "The kernel says 17, so the answer is \\boxed{17}.",
    ]
    out = run_stages(
        get_handler("math"),
        {"problem": "What is 3*4+5?", "answer": "17", "max_turns": 3},
        turns,
        sandboxes=sandboxes,
        tokenizer=tiny_tokenizer,
    )
    assert out.run.outcome is Outcome.OK, out.run.reason
    assert out.eval is not None and out.eval.reward == 1.0
    # The tool's real output reached the model's second prompt.
    second_prompt = tiny_tokenizer.decode(out.llm.prompts[1])
    assert "<tool_response>\n17\n</tool_response>" in second_prompt
    assert out.run.trajectory.info["tool_calls"] == 1


def test_code_answer_in_text_scored_by_hidden_tests(tiny_tokenizer: Any, sandboxes: Any) -> None:
    problem = next(p for p in code_problems().values() if p.reference_solution)
    handler = get_handler("code")
    good = run_stages(
        handler,
        {"problem_id": problem.id, "max_turns": 1},
        [f"Here it is:\n{FENCE}python\n{problem.reference_solution}\n{FENCE}"],
        sandboxes=sandboxes,
        tokenizer=tiny_tokenizer,
    )
    assert good.eval is not None
    assert good.eval.reward == 1.0, good.eval.info
    assert good.eval.metrics["passed"] == good.eval.metrics["total"] == len(problem.tests)
    bad = run_stages(
        handler,
        {"problem_id": problem.id, "max_turns": 1},
        [f"{FENCE}python\ndef {problem.entry_point}(*args, **kwargs):\n    return None\n{FENCE}"],
        sandboxes=sandboxes,
        tokenizer=tiny_tokenizer,
    )
    assert bad.eval is not None and bad.eval.reward < 1.0
    assert bad.eval.info["grade"]["reason"]


def test_code_solution_file_written_with_tools(tiny_tokenizer: Any, sandboxes: Any) -> None:
    problem = next(p for p in code_problems().values() if p.reference_solution)
    turns = [
        format_call("editor", {"command": "create", "path": "solution.py", "file_text": problem.reference_solution}),
        format_call("submit", {}),
    ]
    out = run_stages(
        get_handler("code"),
        {"problem_id": problem.id, "reward": "all"},
        turns,
        sandboxes=sandboxes,
        tokenizer=tiny_tokenizer,
    )
    assert out.run.outcome is Outcome.OK
    assert out.init_state["solution_from"] == "solution.py"
    assert out.eval is not None and out.eval.reward == 1.0


def test_code_eval_ignores_what_the_agent_left_in_its_sandbox(tiny_tokenizer: Any, sandboxes: Any) -> None:
    """A forged harness and report in the agent's workspace do not reach EVAL's fresh sandbox."""
    problem = next(p for p in code_problems().values() if p.reference_solution)
    forged = "import sys\nprint('forged')\n"
    turns = [
        format_call("bash", {"command": f"printf '%s' {forged!r} > _farm_harness.py && echo all-pass > .farm_report"}),
        f"{FENCE}python\ndef {problem.entry_point}(*a, **k):\n    raise SystemExit(0)\n{FENCE}",
    ]
    out = run_stages(
        get_handler("code"),
        {"problem_id": problem.id, "reward": "all"},
        turns,
        sandboxes=sandboxes,
        tokenizer=tiny_tokenizer,
    )
    assert out.eval is not None and out.eval.reward == 0.0


@pytest.mark.parametrize(
    ("task_type", "config", "field"),
    [
        ("math", {"problem_id": "no-such-problem"}, "problem_id"),
        ("math", {"problem": "1+1?"}, "answer"),
        ("math", {"problem_id": "arithmetic-000", "max_turns": 0}, "max_turns"),
        ("code", {"problem_id": "add-two", "reward": "most"}, "reward"),
        ("code", {"problem_id": "no-such-problem"}, "problem_id"),
        ("code", {"problem_id": "add-two", "timeout_s": -1}, "timeout_s"),
        ("swe", {"instance_id": "nope"}, "instance_id"),
        ("swe", {}, "instance_id"),
        ("swe", {"instance_id": "rollout-farm__semver-1", "bogus": 1}, "bogus"),
        ("harbor", {"example": "nope"}, "example"),
        ("harbor", {"path": "relative/dir"}, "path"),
        ("harbor", {"example": "hello-file", "max_turns": "many"}, "max_turns"),
    ],
)
def test_bad_specs_name_the_field(task_type: str, config: dict[str, Any], field: str) -> None:
    from farm.errors import InvalidSpec

    with pytest.raises(InvalidSpec) as caught:
        get_handler(task_type).validate(config)
    assert field in str(caught.value), str(caught.value)
