"""The code reward: run a problem's hidden tests against the candidate's code in a child process.

``grade`` writes ``solution.py``, the tests and the harness into a working directory and runs
``<python> -I _farm_harness.py`` there with a wall-clock limit (``python`` is a command prefix,
so the lead can pass a sandbox wrapper such as ``["bwrap", ..., "python3"]``). Each test passes
or fails on its own; the reward is the fraction passed or all-or-nothing (``RewardMode``).
For running the harness some other way (a sandbox's exec API), use ``prepare`` and
``parse_report`` directly.

The candidate runs in the same interpreter as the harness, so a determined program could
still forge reports (it can read the harness's memory); the nonce stops accidental and casual
forgery, the sandbox bounds the rest.
"""

from __future__ import annotations

import json
import re
import secrets
import shutil
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from tasks._proc import ProcResult, run_bounded
from tasks.code.dataset import CodeProblem

RewardMode = Literal["fraction", "all"]
#: wall-clock limit of one whole test run.
DEFAULT_RUN_TIMEOUT_S = 20.0
#: limit of one test inside the run (SIGALRM in the harness).
DEFAULT_PER_TEST_TIMEOUT_S = 5.0
#: output of the run kept per stream for the info dict.
MAX_OUTPUT_BYTES = 16_000
HARNESS_SOURCE = Path(__file__).with_name("harness.py")
HARNESS_FILE = "_farm_harness.py"
FENCE = "`" * 3
_LANGUAGE_TAG = re.compile(r"[A-Za-z0-9_+-]{0,20}")


@dataclass(frozen=True)
class CaseOutcome:
    """One hidden test: passed or not, with the error text (``timeout`` or the exception)."""

    index: int
    passed: bool
    error: str | None = None


@dataclass(frozen=True)
class CodeResult:
    """What a test run gave; ``reason`` is set when not every test passed."""

    reward: float
    passed: int
    total: int
    tests: list[CaseOutcome] = field(default_factory=list)
    timed_out: bool = False
    reason: str | None = None
    stdout: str = ""
    stderr: str = ""

    def info(self) -> dict[str, Any]:
        return {
            "passed": self.passed,
            "total": self.total,
            "timed_out": self.timed_out,
            "reason": self.reason,
            "failures": [{"index": t.index, "error": t.error} for t in self.tests if not t.passed][:10],
            "stderr": self.stderr[-2000:],
        }


def extract_code(response_text: str) -> str:
    """The last fenced code block of a response, or the whole response when it has none."""
    # split, not a regex: linear on long responses with many fences.
    parts = response_text.split(FENCE)
    pairs = (len(parts) - 1) // 2
    if pairs == 0:
        return response_text
    block = parts[2 * pairs - 1]
    first_line, newline, rest = block.partition("\n")
    return rest if newline and _LANGUAGE_TAG.fullmatch(first_line.strip()) else block


def prepare(*, problem: CodeProblem, solution: str, workdir: Path, per_test_timeout_s: float) -> str:
    """Write the files of a run into ``workdir``; returns the nonce to feed on stdin."""
    workdir.mkdir(parents=True, exist_ok=True)
    (workdir / "solution.py").write_text(solution, encoding="utf-8")
    spec = {"tests": problem.tests, "per_test_timeout_s": per_test_timeout_s, "entry_point": problem.entry_point}
    (workdir / "_farm_tests.json").write_text(json.dumps(spec), encoding="utf-8")
    shutil.copyfile(HARNESS_SOURCE, workdir / HARNESS_FILE)
    return secrets.token_hex(16)


def parse_report(stdout: str, *, nonce: str, total: int) -> tuple[list[CaseOutcome], str | None]:
    """Per-test outcomes from the harness's report lines; a test without a line failed.

    Returns:
        ``(outcomes, problem)``: ``problem`` says why the run did not report normally, or is None.
    """
    found: dict[int, CaseOutcome] = {}
    problem: str | None = "the run ended before reporting every test"
    for line in stdout.splitlines():
        head, _, body = line.partition(" ")
        if head != nonce:
            continue
        try:
            record = json.loads(body)
        except ValueError:
            continue
        if "load_error" in record:
            problem = f"solution failed to load: {record['load_error']}"
        elif record.get("done"):
            problem = None if len(found) == total else problem
        elif isinstance(record.get("index"), int) and 0 <= record["index"] < total and record["index"] not in found:
            found[record["index"]] = CaseOutcome(record["index"], bool(record.get("passed")), record.get("error"))
    missing = "no result (the run ended or timed out)"
    return [found.get(i, CaseOutcome(i, False, missing)) for i in range(total)], problem


def _score(outcomes: list[CaseOutcome], mode: RewardMode) -> float:
    passed = sum(t.passed for t in outcomes)
    if not outcomes:
        return 0.0
    if mode == "all":
        return 1.0 if passed == len(outcomes) else 0.0
    return passed / len(outcomes)


def grade(
    *,
    problem: CodeProblem,
    solution: str,
    workdir: Path,
    python: str | Sequence[str],
    mode: RewardMode = "all",
    timeout_s: float = DEFAULT_RUN_TIMEOUT_S,
    per_test_timeout_s: float = DEFAULT_PER_TEST_TIMEOUT_S,
) -> CodeResult:
    """Run the hidden tests of ``problem`` against ``solution`` (source code) in ``workdir``.

    Raises:
        OSError: ``python`` cannot be started (an infrastructure failure, not a reward of 0).
    """
    nonce = prepare(problem=problem, solution=solution, workdir=workdir, per_test_timeout_s=per_test_timeout_s)
    prefix = [python] if isinstance(python, str) else list(python)
    proc: ProcResult = run_bounded(
        [*prefix, "-I", HARNESS_FILE],
        cwd=workdir,
        timeout_s=timeout_s,
        stdin=(nonce + "\n").encode(),
        max_output_bytes=MAX_OUTPUT_BYTES,
    )
    return score_report(
        problem=problem,
        stdout=proc.stdout,
        stderr=proc.stderr,
        nonce=nonce,
        mode=mode,
        timed_out=proc.timed_out,
        timeout_s=timeout_s,
    )


def score_report(
    *,
    problem: CodeProblem,
    stdout: str,
    stderr: str,
    nonce: str,
    mode: RewardMode,
    timed_out: bool,
    timeout_s: float,
) -> CodeResult:
    """The result of a harness run from its output (however it was run: here or in a sandbox)."""
    outcomes, problem_text = parse_report(stdout, nonce=nonce, total=len(problem.tests))
    if timed_out:
        problem_text = f"the test run exceeded {timeout_s:g} s"
    passed = sum(t.passed for t in outcomes)
    if problem_text is None and passed < len(outcomes):
        problem_text = f"{len(outcomes) - passed} of {len(outcomes)} tests failed"
    return CodeResult(
        reward=_score(outcomes, mode),
        passed=passed,
        total=len(outcomes),
        tests=outcomes,
        timed_out=timed_out,
        reason=problem_text,
        stdout=stdout,
        stderr=stderr,
    )
