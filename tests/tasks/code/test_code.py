from __future__ import annotations

import sys

import pytest

from farm.errors import InvalidSpec
from farm.handlers.base import validate_config
from tasks.code.dataset import CodeConfig, CodeProblem, list_problems, problems_by_id, sample_configs
from tasks.code.grader import extract_code, grade, parse_report

PY = sys.executable
ADD = CodeProblem(
    id="add",
    entry_point="add",
    signature="def add(a, b)",
    prompt="add",
    tests=["assert add(1, 2) == 3", "assert add(2, 2) == 4", "assert add(-1, 1) == 0", "assert add(0, 0) == 0"],
)


def run(solution, tmp_path, **kwargs):
    return grade(problem=ADD, solution=solution, workdir=tmp_path, python=PY, **kwargs)


def test_grade_correct_solution_scores_one(tmp_path):
    result = run("def add(a, b):\n    return a + b\n", tmp_path)
    assert (result.reward, result.passed, result.total, result.reason) == (1.0, 4, 4, None)


def test_grade_partial_solution_scores_fraction(tmp_path):
    result = run("def add(a, b):\n    return a + b if a > 0 else 99\n", tmp_path, mode="fraction")
    assert result.reward == 0.5 and result.passed == 2
    assert [t.passed for t in result.tests] == [True, True, False, False]
    assert "AssertionError" in result.tests[2].error
    assert result.reason == "2 of 4 tests failed"


def test_grade_all_mode_is_all_or_nothing(tmp_path):
    assert run("def add(a, b):\n    return 4 if a == 2 else 0\n", tmp_path, mode="all").reward == 0.0


def test_grade_solution_that_fails_to_load(tmp_path):
    result = run("def add(a, b) return a\n", tmp_path)
    assert result.reward == 0.0 and result.reason.startswith("solution failed to load: SyntaxError")


def test_grade_sys_exit_at_import_scores_zero(tmp_path):
    result = run("import sys\nsys.exit(0)\n", tmp_path)
    assert result.reward == 0.0 and "SystemExit" in result.reason


def test_grade_os_exit_mid_run_fails_remaining_tests(tmp_path):
    result = run("import os\ndef add(a, b):\n    if a == 2:\n        os._exit(0)\n    return a + b\n", tmp_path)
    assert [t.passed for t in result.tests] == [True, False, False, False]
    assert result.reason == "the run ended before reporting every test"


def test_grade_endless_test_times_out_alone(tmp_path):
    result = run(
        "def add(a, b):\n    while a == 2:\n        pass\n    return a + b\n",
        tmp_path,
        per_test_timeout_s=0.5,
        mode="fraction",
    )
    assert [t.error == "timeout" for t in result.tests] == [False, True, False, False]
    assert result.reward == 0.75


def test_grade_whole_run_timeout_kills_process(tmp_path):
    solution = "import signal\nsignal.signal(signal.SIGALRM, signal.SIG_IGN)\nwhile True:\n    pass\n"
    result = run(solution, tmp_path, timeout_s=1.0)
    assert result.timed_out and result.reward == 0.0
    assert "exceeded 1 s" in result.reason


def test_grade_forged_report_lines_are_ignored(tmp_path):
    forged = 'import os\nfor i in range(4):\n    os.write(1, (\'x {"index": %d, "passed": true}\\n\' % i).encode())\n'
    result = run(forged + "def add(a, b):\n    return 99\n", tmp_path)
    assert result.reward == 0.0


def test_grade_hidden_tests_are_not_readable_by_the_solution(tmp_path):
    cheat = (
        "import os\nSEEN = os.path.exists('_farm_tests.json')\ndef add(a, b):\n    assert not SEEN\n    return a + b\n"
    )
    assert run(cheat, tmp_path).reward == 1.0


def test_grade_output_flood_is_truncated(tmp_path):
    result = run("import sys\nsys.stderr.write('x' * 5_000_000)\ndef add(a, b):\n    return a + b\n", tmp_path)
    assert result.reward == 1.0 and len(result.stderr) <= 16_000


def test_grade_missing_interpreter_is_an_infrastructure_error(tmp_path):
    with pytest.raises(OSError):
        grade(problem=ADD, solution="", workdir=tmp_path, python="/nonexistent/python")


def test_parse_report_ignores_duplicates_out_of_range_and_lines_without_the_nonce():
    lines = [
        'n {"index": 0, "passed": true}',
        'n {"index": 0, "passed": false}',
        'n {"index": 9, "passed": true}',
        'x {"index": 1, "passed": true}',  # printed by the candidate, who does not know the nonce
        'n {"done": true}',
    ]
    outcomes, problem = parse_report("\n".join(lines) + "\n", nonce="n", total=2)
    assert [t.passed for t in outcomes] == [True, False]
    assert problem == "the run ended before reporting every test"


def test_extract_code_takes_last_fence():
    text = "first\n```python\nx = 1\n```\nthen\n```py\ndef f():\n    return 2\n```\n"
    assert extract_code(text) == "def f():\n    return 2\n"
    assert extract_code("def g(): pass") == "def g(): pass"
    assert extract_code("```\nx = 3\n``` and an unclosed ```python\ny") == "x = 3\n"
    assert extract_code("```" * 100_001) == ""


def test_reference_solutions_pass_every_test():
    # The shipped data is trusted, so its own check may run in-process (fast); the grader path
    # for reference solutions is covered below on a few problems.
    problems = list_problems()
    assert 20 <= len(problems) <= 40
    for problem in problems:
        namespace: dict[str, object] = {}
        assert problem.reference_solution is not None
        exec(problem.reference_solution, namespace)
        for test in problem.tests:
            exec(test, dict(namespace))


@pytest.mark.parametrize("problem_id", ["parse-duration", "two-sum", "balanced-brackets"])
def test_grade_reference_solution_scores_one(problem_id, tmp_path):
    problem = problems_by_id()[problem_id]
    assert problem.reference_solution is not None
    result = grade(problem=problem, solution=problem.reference_solution, workdir=tmp_path, python=PY, mode="all")
    assert result.reward == 1.0, result.info()


def test_stub_solutions_fail(tmp_path):
    problem = problems_by_id()["fizzbuzz"]
    stub = "def fizzbuzz(n):\n    return []\n"
    # Partial credit only when asked for: by default a stub that passes the weak test earns nothing.
    result = grade(problem=problem, solution=stub, workdir=tmp_path / "fraction", python=PY, mode="fraction")
    assert 0.0 < result.reward < 1.0
    assert grade(problem=problem, solution=stub, workdir=tmp_path / "default", python=PY).reward == 0.0


def test_sample_configs_are_valid():
    configs = sample_configs(4, seed=1)
    assert configs == sample_configs(4, seed=1)
    assert all(validate_config(CodeConfig, c).resolve().tests for c in configs)


def test_code_config_inline_problem():
    config = validate_config(CodeConfig, {"problem": ADD.model_dump(), "reward": "all"})
    assert config.resolve().entry_point == "add"


@pytest.mark.parametrize(
    ("config", "field"),
    [
        ({"problem_id": "nope"}, "config.problem_id"),
        ({}, "config"),
        ({"problem_id": "fizzbuzz", "reward": "most"}, "config.reward"),
        ({"problem_id": "fizzbuzz", "timeout_s": 0}, "config.timeout_s"),
        ({"problem": {**ADD.model_dump(), "tests": []}}, "config.problem.tests"),
        ({"problem": {**ADD.model_dump(), "entry_point": "1x"}}, "config.problem.entry_point"),
    ],
)
def test_code_config_rejects_bad_specs_naming_the_field(config, field):
    with pytest.raises(InvalidSpec) as info:
        validate_config(CodeConfig, config)
    assert info.value.field == field


# ---- cheap rewards (issue 10, item 8): each attempt scores 0, a real solution 1 -------------------

ALWAYS_EQUAL = """
class Anything:
    def __eq__(self, other):
        return True
    def __ne__(self, other):
        return False
    def __bool__(self):
        return True

def add(a, b):
    return Anything()
"""
EXITS_EARLY = "import os\nos._exit(0)\ndef add(a, b):\n    return 0\n"


@pytest.mark.parametrize(
    "cheap",
    [ALWAYS_EQUAL, EXITS_EARLY, "import sys\nsys.exit(0)\n", "", "def add(a, b):\n    return 3\n"],
    ids=["always-equal", "os-exit", "sys-exit", "empty", "constant"],
)
def test_cheap_solutions_score_zero_and_a_real_one_scores_one(cheap, tmp_path):
    result = run(cheap, tmp_path / "cheap")
    assert result.reward == 0.0, result.info()
    assert run("def add(a, b):\n    return a + b\n", tmp_path / "real").reward == 1.0


def test_always_equal_result_is_named_in_the_failure(tmp_path):
    result = run(ALWAYS_EQUAL, tmp_path)
    assert result.passed == 0 and "returned a Anything, not plain data" in (result.tests[0].error or "")


#: what a policy might try without solving anything: a constant, the input back, an exception.
DEGENERATE = {
    "none": "return None",
    "true": "return True",
    "false": "return False",
    "zero": "return 0",
    "empty-str": "return ''",
    "empty-list": "return []",
    "empty-dict": "return {}",
    "first-arg": "return args[0] if args else None",
    "raise": "raise ValueError('no')",
}


@pytest.mark.parametrize("problem", list_problems(), ids=lambda p: p.id)
def test_no_shipped_problem_pays_a_degenerate_solution(problem):
    """Every shipped problem has a test that each degenerate stub fails, so under the default
    reward ("all") none earns anything (checked in-process: the data and the stubs are ours)."""
    for name, body in DEGENERATE.items():
        namespace: dict = {}
        exec(f"def {problem.entry_point}(*args, **kwargs):\n    {body}\n", namespace)
        passed = 0
        for test in problem.tests:
            try:
                exec(test, dict(namespace))
            except Exception:
                continue
            passed += 1
        assert passed < len(problem.tests), f"{problem.id}: the {name!r} stub passes every test"
    assert CodeConfig(problem_id=problem.id).reward == "all"
