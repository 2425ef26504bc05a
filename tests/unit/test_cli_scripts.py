"""The `farm` command line as a script sees it: results on stdout, messages on stderr, exit status 0
(done), 1 (the farm failed or is unreachable), 2 (refused as asked), and never a traceback for a
setting or an argument. Real invocations of ``python -m farm`` (no farm needs to run: these are the
answers given before or without one)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest
from click.testing import CliRunner

from farm.cli import main

ROOT = Path(__file__).resolve().parents[2]
#: nothing listens on port 9 (discard) here: a connection is refused at once.
DOWN = "http://127.0.0.1:9"


def farm(*args: str, env: dict[str, str] | None = None, code: str | None = None) -> subprocess.CompletedProcess[str]:
    clean = {k: v for k, v in os.environ.items() if not k.startswith("FARM_")}
    command = [sys.executable, "-c", code] if code else [sys.executable, "-m", "farm", *args]
    return subprocess.run(command, env=clean | (env or {}), capture_output=True, text=True, timeout=60, cwd=ROOT)


def assert_one_line(result: subprocess.CompletedProcess[str], status: int) -> None:
    assert result.returncode == status, (result.returncode, result.stderr)
    assert "Traceback" not in result.stderr and result.stderr.strip().count("\n") == 0, result.stderr
    assert result.stdout == ""  # a failure writes no result a script would take for one


def test_a_setting_that_is_wrong_is_one_line_naming_it():
    result = farm("status", "1", env={"FARM_API__PORT": "notaport"})
    assert_one_line(result, 2)
    assert "FARM_API__PORT" in result.stderr and "'notaport'" in result.stderr


@pytest.mark.parametrize(
    "args",
    [("status", "--json"), ("status", "--once"), ("status", "1"), ("cancel", "1"), ("report", "1")],
    ids=lambda a: " ".join(a),
)
def test_an_api_that_is_down_is_a_failure_on_stderr_alone(args: tuple[str, ...]):
    result = farm(*args, "--url", DOWN)
    assert_one_line(result, 1)
    assert f"cannot reach the farm API at {DOWN}/" in result.stderr


def test_submit_to_an_api_that_is_down_captures_nothing(tmp_path: Path):
    tasks = tmp_path / "tasks.jsonl"
    tasks.write_text(json.dumps({"type": "echo", "config": {"text": "x"}}) + "\n")
    result = farm("submit", "--no-wait", str(tasks), "--url", DOWN)
    assert_one_line(result, 1)


@pytest.mark.parametrize(
    "args",
    [("status", "notanumber"), ("submit", "/no/such/file.jsonl"), ("report",), ("no-such-command",)],
    ids=lambda a: " ".join(a),
)
def test_a_usage_error_is_status_2(args: tuple[str, ...]):
    result = CliRunner().invoke(main, list(args))
    assert result.exit_code == 2, result.output
    assert result.stdout == ""


def test_a_tasks_file_that_is_not_jsonl_is_refused_before_any_request(tmp_path: Path):
    tasks = tmp_path / "bad.jsonl"
    tasks.write_text('{"type": "echo"}\n{not json\n')
    result = CliRunner().invoke(main, ["submit", str(tasks), "--url", DOWN])
    assert result.exit_code == 2 and "bad.jsonl:2: not JSON" in result.stderr and result.stdout == ""


def test_help_says_what_the_exit_statuses_mean():
    result = CliRunner().invoke(main, ["--help"])
    assert result.exit_code == 0
    assert "0 done; 1 the farm failed or is unreachable; 2 refused as asked" in " ".join(result.stdout.split())


def test_a_client_only_install_gets_a_farm_that_names_the_extra():
    # The base install has no click (nor rich, nor pydantic-settings): hide it from this interpreter.
    result = farm(code="import sys; sys.modules['click'] = None; from farm.__main__ import main; main()")
    first_line = result.stderr.splitlines()[0] if result.stderr else ""
    assert result.returncode == 2 and "Traceback" not in result.stderr, result.stderr
    assert "pip install 'rollout-farm[server]'" in first_line and "click" in first_line
    # ... and the `farm` console script is that entry point, not farm.cli (which imports click).
    scripts = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["scripts"]
    assert scripts["farm"] == "farm.__main__:main"
