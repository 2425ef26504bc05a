from __future__ import annotations

import os
import signal
import time

from farm.tools.exec import run_command

ENV = {"PATH": "/usr/bin:/bin"}


def test_run_command_returns_output_and_code(tmp_path) -> None:
    result = run_command("echo hi; exit 4", cwd=str(tmp_path), env=ENV, timeout_s=10, output_cap_bytes=1000)
    assert (result.output, result.exit_code, result.timed_out) == ("hi\n", 4, False)


def test_run_command_argv_form(tmp_path) -> None:
    result = run_command(
        ["printf", "%s-%s", "a b", "c"], cwd=str(tmp_path), env=ENV, timeout_s=10, output_cap_bytes=100
    )
    assert result.output == "a b-c"


def test_run_command_timeout_kills_the_group(tmp_path) -> None:
    marker = tmp_path / "late"
    result = run_command(
        f"(sleep 1; touch {marker}) & sleep 30", cwd=str(tmp_path), env=ENV, timeout_s=0.3, output_cap_bytes=100
    )
    assert result.timed_out and result.exit_code is None
    time.sleep(1.5)
    assert not marker.exists()


def test_run_command_background_child_does_not_hang(tmp_path) -> None:
    result = run_command("sleep 30 & echo done", cwd=str(tmp_path), env=ENV, timeout_s=10, output_cap_bytes=100)
    assert result.output == "done\n" and not result.timed_out


def test_run_command_missing_program_is_data(tmp_path) -> None:
    result = run_command(["/no/such/program"], cwd=str(tmp_path), env=ENV, timeout_s=5, output_cap_bytes=100)
    assert result.exit_code is None and result.error is not None


def test_run_command_signal_death_reports_128_plus_signal(tmp_path) -> None:
    result = run_command("kill -9 $$", cwd=str(tmp_path), env=ENV, timeout_s=5, output_cap_bytes=100)
    assert result.exit_code == 137


def test_run_command_output_limit_kills_the_command(tmp_path) -> None:
    result = run_command(
        "yes", cwd=str(tmp_path), env=ENV, timeout_s=60, output_cap_bytes=100, output_limit_bytes=1_000_000
    )
    assert result.info["output_limit_hit"] is True and result.exit_code is None
    assert result.truncated and result.output.startswith("y\ny\n") and len(result.output) < 200


def test_run_command_returns_while_an_escaped_child_still_floods_the_pipe(tmp_path) -> None:
    # A child that left the process group (setsid) survives the group kill and keeps the pipe full.
    pidfile = tmp_path / "pid"
    result = run_command(
        f"setsid yes & echo $! > {pidfile}; sleep 0.2", cwd=str(tmp_path), env=ENV, timeout_s=30, output_cap_bytes=100
    )
    try:
        assert result.exit_code == 0 and result.truncated
    finally:
        os.kill(int(pidfile.read_text()), signal.SIGKILL)
