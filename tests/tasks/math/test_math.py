from __future__ import annotations

import pytest

from farm.errors import InvalidSpec
from farm.handlers.base import validate_config
from tasks.math import generate
from tasks.math.dataset import DATA_PATH, MathConfig, list_problems, sample_configs
from tasks.math.equivalence import as_fraction, symbolic_allowed
from tasks.math.extract import MAX_RESPONSE_CHARS, extract_answer, normalize
from tasks.math.grader import grade


@pytest.mark.parametrize(
    ("response", "reference"),
    [
        (r"First \boxed{2}, no wait: \boxed{\frac{3}{4}}", "0.75"),
        (r"$\boxed{\dfrac{3}{4}}$", "3/4"),
        ("The answer is 0.75.", r"\frac{3}{4}"),
        ("Answer: 1,234,567", "1234567"),
        (r"\boxed{1{,}234}", "1234"),
        ("So the total is 12 apples. The answer is 12 apples", "12"),
        (r"\boxed{40 \text{ km}}", "40"),
        (r"\boxed{25\%}", "25"),
        (r"\boxed{\$12.50}", "12.5"),
        (r"\boxed{x = -3}", "-3"),
        (r"\boxed{90^\circ}", "90"),
        (r"\boxed{\left(\frac{1}{2}\right)}", "1/2"),
        ("I computed it.\n\n42", "42"),
        (r"\boxed 7", "7"),
    ],
)
def test_grade_accepts_equivalent_formats(response, reference):
    reward, info = grade(response, reference)
    assert reward == 1.0, info


@pytest.mark.parametrize(
    ("response", "reference"),
    [
        (r"\boxed{5\sqrt{2}}", r"\sqrt{50}"),
        (r"\boxed{x^2 + 5x + 6}", "(x+2)(x+3)"),
        (r"\boxed{2x+1}", "1 + 2x"),
        (r"\boxed{16\pi}", r"16 \cdot \pi"),
        (r"\boxed{(1, \frac{1}{2})}", "(1, 0.5)"),
    ],
)
def test_grade_symbolic_equivalence(response, reference):
    reward, info = grade(response, reference)
    assert reward == 1.0, info


@pytest.mark.parametrize(
    ("response", "reference"),
    [
        (r"\boxed{\frac{3}{4}} is wrong, really \boxed{0.7}", "3/4"),
        ("The answer is 0.333", "1/3"),
        (r"\boxed{2x+2}", "2x+1"),
        (r"\boxed{5\sqrt{3}}", r"5\sqrt{2}"),
        (r"\boxed{(1, 2)}", "(1, 2, 3)"),
        (r"\boxed{25}", "0.25"),
    ],
)
def test_grade_rejects_wrong_answers(response, reference):
    reward, info = grade(response, reference)
    assert reward == 0.0, info


def test_grade_no_answer():
    reward, info = grade("I am not sure how to do this.", "4")
    assert reward == 0.0 and info["reason"] == "no answer found"


def test_grade_power_tower_times_out_as_reward_zero():
    reward, info = grade(r"\boxed{9^{9^{9^{9}}}}", "3", timeout_s=1.0)
    assert reward == 0.0 and info["reason"] == "symbolic comparison timed out"


@pytest.mark.parametrize(
    "payload", ["__import__('os').system('true')", "exec(1)", "x.__class__", "lambda: 1", "a" * 500]
)
def test_grade_refuses_unsafe_expressions_before_sympy(payload):
    assert not symbolic_allowed(normalize(payload))
    reward, info = grade(f"\\boxed{{{payload}}}", "x + 1")
    assert reward == 0.0 and info["reason"] == "not a safe expression"


def test_grade_huge_response_is_bounded():
    reward, _ = grade("9" * 1_000_000 + " The answer is 3", "3")
    assert reward == 1.0


def test_grade_unbalanced_boxed_falls_back_to_phrase():
    reward, info = grade(r"The answer is 5. \boxed{5", "5")
    assert reward == 1.0, info


def test_grade_text_alone_is_the_answer():
    reward, info = grade(r"\boxed{\text{yes}}", "yes")
    assert reward == 1.0, info


def test_grade_an_answer_that_normalizes_to_nothing_is_empty():
    reward, info = grade(r"\boxed{\text{ }}", "0")
    assert reward == 0.0 and info["reason"] == "empty answer"


@pytest.mark.parametrize("response", ["The answer is 3 or 4.", r"\boxed{3 \text{ or } 4}", r"\boxed{3 \lor 4}"])
def test_extract_answer_that_offers_alternatives_is_none(response):
    # The grader would score some of these 0 anyway, for other reasons: check the rule itself.
    assert extract_answer(response) is None


def test_extract_answer_reads_only_the_end_of_a_huge_response():
    assert extract_answer(r"\boxed{4}" + " " * MAX_RESPONSE_CHARS) is None


def test_extract_answer_phrase_keeps_decimal_point():
    assert extract_answer("so the answer is 3.5. Done") == "3.5"


def test_normalize_keeps_math_names_after_numbers():
    assert normalize(r"3\pi") == r"3\pi"
    assert normalize("12 dollars") == "12"


def test_as_fraction_forms():
    assert as_fraction(r"-\frac{6}{8}") == as_fraction("-3/4") == as_fraction("-0.75")
    assert as_fraction(r"\frac34") == as_fraction("0.75")
    assert as_fraction("1/0") is None
    assert as_fraction("x") is None


def test_dataset_matches_generator_and_solves_itself():
    assert DATA_PATH.read_text(encoding="utf-8") == generate.render()
    problems = list_problems()
    assert len(problems) == 120 and len({p.id for p in problems}) == 120
    for p in problems[::7]:
        assert grade(f"The answer is $\\boxed{{{p.answer}}}$", p.answer)[0] == 1.0


def test_sample_configs_reproducible_and_valid():
    first = sample_configs(5, seed=3)
    assert first == sample_configs(5, seed=3) and len({c["problem_id"] for c in first}) == 5
    assert all(validate_config(MathConfig, c).resolve().answer for c in first)


def test_math_config_inline_problem():
    problem = validate_config(MathConfig, {"problem": "1+1?", "answer": "2"}).resolve()
    assert problem.answer == "2"


@pytest.mark.parametrize(
    ("config", "field"),
    [
        ({"problem_id": "nope"}, "config.problem_id"),
        ({"problem": "1+1"}, "config"),
        ({"problem": "1+1", "answer": ""}, "config.answer"),
        ({"problem_id": "arithmetic-000", "extra": 1}, "config.extra"),
        ({"problem_id": "arithmetic-000", "max_turns": 0}, "config.max_turns"),
    ],
)
def test_math_config_rejects_bad_specs_naming_the_field(config, field):
    with pytest.raises(InvalidSpec) as info:
        validate_config(MathConfig, config)
    assert info.value.field == field


@pytest.mark.parametrize(
    "response",
    [
        "The answer is 1 " + "a" * 400 + "!",  # exponential backtracking in a unit-word pattern
        "\\boxed{" * 5000,  # quadratic brace matching
        "answer is " * 5000,
        "{" * 10000 + "}" * 3,
    ],
)
def test_grade_pathological_responses_finish(response):
    reward, _ = grade(response, "4", timeout_s=1.0)
    assert reward == 0.0


@pytest.mark.parametrize(
    ("response", "reference"),
    [
        ("I tried a few things and ended with 5", "5"),  # no final answer: no longer the last number
        (r"\boxed{4} or maybe \boxed{3}", "4"),  # only the last box is graded
        ("The result: 5 apples and more text", "5"),
        (r"\boxed{3 \text{ or } 4}", "4"),
        ("The answer is 3 or 4.", "3"),
        (r"\boxed{3 \lor 4}", "4"),
        (r"\boxed{3 4}", "12"),  # two numbers side by side are not their product
        (r"\boxed{3x - y}", "x + y"),  # equal only where x == y: each symbol gets its own value
    ],
)
def test_grade_pays_nothing_for_a_cheap_attempt(response, reference):
    reward, info = grade(response, reference)
    assert reward == 0.0, info


@pytest.mark.parametrize(
    ("response", "reference"),
    [
        (r"First \boxed{3}, no, checking again: \boxed{4.0}.", "4"),  # a corrected answer: the last box
        ("Working...\n\n$-3/4$", "-0.75"),  # a last line that is only a number
        ("So the answer is 12 apples.", "12"),
        (r"\boxed{\frac{3}{4}}", "0.75"),
        ("Answer: 1,234", "1234"),
    ],
)
def test_grade_still_pays_a_real_answer(response, reference):
    reward, info = grade(response, reference)
    assert reward == 1.0, info
