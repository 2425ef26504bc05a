from __future__ import annotations

import os
from collections.abc import Iterator

import pytest

from farm.tools.bash import BashSession


@pytest.fixture
def bash(tmp_path) -> Iterator[BashSession]:
    session = BashSession(cwd=str(tmp_path), env={"PATH": os.environ.get("PATH", "/usr/bin:/bin")})
    yield session
    session.close()


def test_bash_state_persists_between_calls(bash: BashSession, tmp_path) -> None:
    (tmp_path / "sub").mkdir()
    bash.run('cd sub && export GREETING=hello && f() { echo "f:$1"; }')
    result = bash.run('pwd; echo "$GREETING"; f x')
    assert result.output == f"{tmp_path / 'sub'}\nhello\nf:x\n"
    assert result.exit_code == 0


def test_bash_reports_exit_code_and_stderr(bash: BashSession) -> None:
    result = bash.run("echo out; echo err >&2; (exit 7)")
    assert result.exit_code == 7
    assert result.output == "out\nerr\n"
    assert not result.timed_out and result.error is None


def test_bash_output_without_trailing_newline(bash: BashSession) -> None:
    assert bash.run("printf abc").output == "abc"


def test_bash_sentinel_text_in_command_does_not_end_the_call(bash: BashSession) -> None:
    # cat echoes the sentinel command line as typed: only the printed form (with a code) counts.
    result = bash.run("echo '__FARM_deadbeef1_0__'; printf '__FARM_%s_%s__\\n' x 1", timeout_s=5)
    assert result.exit_code == 0
    assert "__FARM_deadbeef1_0__" in result.output


def test_bash_heredoc_and_history_characters(bash: BashSession) -> None:
    result = bash.run("cat <<'EOF'\nline one!\nline two\nEOF")
    assert result.output == "line one!\nline two\n"


def test_bash_timeout_interrupts_and_shell_survives(bash: BashSession) -> None:
    bash.run("export KEEP=1")
    result = bash.run("echo started; sleep 30", timeout_s=0.5)
    assert result.timed_out and result.exit_code is None
    assert "started" in result.output
    after = bash.run("echo $KEEP")
    assert after.output == "1\n" and after.exit_code == 0
    assert "shell_restarted" not in after.info


def test_bash_timeout_kills_a_command_that_ignores_ctrl_c(bash: BashSession) -> None:
    result = bash.run("bash -c 'trap \"\" INT; sleep 30'", timeout_s=0.5)
    assert result.timed_out
    assert bash.run("echo alive").output == "alive\n"


def test_bash_unfinished_quote_times_out_and_recovers(bash: BashSession) -> None:
    assert bash.run("echo 'unclosed", timeout_s=0.5).timed_out
    assert bash.run("echo fine").output == "fine\n"


def test_bash_background_process_does_not_hang_the_call(bash: BashSession) -> None:
    result = bash.run("sleep 30 & echo launched", timeout_s=5)
    assert not result.timed_out
    assert "launched" in result.output


def test_bash_big_output_is_truncated_head_and_tail(tmp_path) -> None:
    session = BashSession(cwd=str(tmp_path), env={"PATH": "/usr/bin:/bin"}, output_cap_bytes=1000)
    try:
        result = session.run("seq 1 100000")
    finally:
        session.close()
    assert result.truncated and result.exit_code == 0
    assert result.output.startswith("1\n2\n3\n")
    assert result.output.endswith("99999\n100000\n")
    assert "bytes of output omitted" in result.output
    assert len(result.output) < 1200


def test_bash_exit_restarts_the_shell_and_says_so(bash: BashSession) -> None:
    bash.run("export GONE=1")
    result = bash.run("exit 3")
    assert result.error is not None and "new shell" in result.error
    after = bash.run('echo "[$GONE]"')
    assert after.output == "[]\n" and after.exit_code == 0


def test_bash_survives_terminal_mode_changes(bash: BashSession) -> None:
    # bash restores saved terminal modes after a job dies of a signal; the agent may change them too.
    bash.run("stty onlcr")
    result = bash.run("echo x", timeout_s=5)
    assert not result.timed_out and result.exit_code == 0
    assert result.output == "x\r\n"


def test_bash_output_limit_stops_an_endless_printer_and_the_shell_lives_on(tmp_path) -> None:
    session = BashSession(
        cwd=str(tmp_path), env={"PATH": "/usr/bin:/bin"}, output_cap_bytes=1000, output_limit_bytes=2_000_000
    )
    try:
        result = session.run("export KEEP=1; yes", timeout_s=60)
        assert result.info["output_limit_hit"] is True and not result.timed_out
        assert result.exit_code is None and "limit of 2000000 bytes" in (result.error or "")
        assert result.truncated and len(result.output) < 1100
        assert result.info["output_bytes"] > 2_000_000
        after = session.run("echo $KEEP")
        assert after.output == "1\n" and "shell_restarted" not in after.info
    finally:
        session.close()


def test_bash_output_limit_stops_a_command_at_the_limit_not_when_it_ends(tmp_path) -> None:
    # A command that would end by itself soon after passing the limit: only a stop at the limit
    # tells it from a command that printed within it (no timeout to wait for either way).
    session = BashSession(
        cwd=str(tmp_path), env={"PATH": "/usr/bin:/bin"}, output_cap_bytes=1000, output_limit_bytes=200_000
    )
    try:
        result = session.run("head -c 2000000 /dev/zero | tr '\\0' x; echo END", timeout_s=30)
        assert result.info.get("output_limit_hit") is True and not result.timed_out
        assert result.exit_code is None and "limit of 200000 bytes" in (result.error or "")
        assert "END" not in result.output
        assert session.run("echo alive").output == "alive\n"
    finally:
        session.close()
