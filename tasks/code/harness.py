"""Test runner copied next to the candidate's code and run by the grader in a child process.

Standard library only, Python 3.8+ (it runs under whatever interpreter the sandbox has).
Protocol: the first line of stdin is a one-time nonce; every report line the harness writes
to the original stdout starts with it, so text the candidate prints cannot pass for a result.
The candidate's own prints go to stderr. Each test runs in a copy of the solution's namespace
under a SIGALRM limit, so one endless test fails alone instead of eating the whole budget.
The tests call the entry point through a check that its result is plain data (exact builtin
types), so an object whose ``__eq__`` always answers True passes no ``assert f(x) == y``.
"""

from __future__ import annotations

import json
import os
import signal
import sys
import traceback
from types import FrameType
from typing import Any

SOLUTION_FILE = "solution.py"
TESTS_FILE = "_farm_tests.json"
MAX_ERROR_CHARS = 500
#: the types a solution's results may have (exactly, not subclasses), nested up to PLAIN_DEPTH.
PLAIN_TYPES = (int, float, complex, str, bytes, bool, type(None), list, tuple, dict, set, frozenset)
PLAIN_DEPTH = 50


class _TestTimeout(BaseException):
    pass


def _plain(value: Any, depth: int = 0) -> bool:
    """Whether ``value`` is plain data: an object whose ``__eq__`` always says True is not."""
    kind = type(value)
    if depth > PLAIN_DEPTH or not any(kind is t for t in PLAIN_TYPES):
        return False
    if kind is dict:
        return all(_plain(k, depth + 1) and _plain(v, depth + 1) for k, v in value.items())
    if kind in (list, tuple, set, frozenset):
        return all(_plain(item, depth + 1) for item in value)
    return True


def _checked(function: Any) -> Any:
    """``function`` as the tests call it: a result that is not plain data fails the test."""

    def call(*args: Any, **kwargs: Any) -> Any:
        result = function(*args, **kwargs)
        if not _plain(result):
            raise TypeError("the solution returned a " + type(result).__name__ + ", not plain data")
        return result

    return call


def _alarm(signum: int, frame: FrameType | None) -> None:
    raise _TestTimeout()


def main() -> None:
    nonce = sys.stdin.readline().strip()
    sys.stdin.close()
    with open(TESTS_FILE, encoding="utf-8") as f:
        spec = json.load(f)
    # The candidate must not read the expected values off the disk and echo them back.
    try:
        os.unlink(TESTS_FILE)
    except OSError:
        pass
    report = os.fdopen(os.dup(1), "w", encoding="utf-8")
    os.dup2(2, 1)  # the candidate's prints go to stderr
    sys.stdout = sys.stderr

    def emit(record: dict[str, Any]) -> None:
        report.write(nonce + " " + json.dumps(record) + "\n")
        report.flush()

    namespace: dict[str, Any] = {"__name__": "solution"}
    try:
        with open(SOLUTION_FILE, encoding="utf-8") as f:
            source = f.read()
        exec(compile(source, SOLUTION_FILE, "exec"), namespace)
    except BaseException as exc:  # the candidate may raise anything, SystemExit included
        emit({"load_error": (type(exc).__name__ + ": " + str(exc))[:MAX_ERROR_CHARS]})
        return
    entry = spec.get("entry_point")
    if entry and callable(namespace.get(entry)):
        namespace[entry] = _checked(namespace[entry])
    signal.signal(signal.SIGALRM, _alarm)
    for index, test in enumerate(spec["tests"]):
        record: dict[str, Any] = {"index": index, "passed": False, "error": None}
        try:
            signal.setitimer(signal.ITIMER_REAL, spec["per_test_timeout_s"])
            exec(compile(test, f"test_{index}", "exec"), dict(namespace))
            signal.setitimer(signal.ITIMER_REAL, 0)
            record["passed"] = True
        except _TestTimeout:
            record["error"] = "timeout"
        except BaseException as exc:
            signal.setitimer(signal.ITIMER_REAL, 0)
            lines = traceback.format_exception_only(type(exc), exc)
            record["error"] = "".join(lines).strip()[:MAX_ERROR_CHARS] or type(exc).__name__
        emit(record)
    emit({"done": True})


if __name__ == "__main__":
    main()
