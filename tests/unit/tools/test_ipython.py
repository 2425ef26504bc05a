from __future__ import annotations

from collections.abc import Iterator

import pytest

from farm.tools.ipython import IPythonSession, strip_ansi

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def ipy(tmp_path_factory) -> Iterator[IPythonSession]:
    session = IPythonSession(cwd=str(tmp_path_factory.mktemp("ipy")))
    yield session
    session.close()


def test_ipython_state_persists_and_last_value_is_returned(ipy: IPythonSession) -> None:
    first = ipy.run("x = 41\nprint('printed')")
    assert first.ok and first.output == "printed\n"
    second = ipy.run("x + 1")
    assert second.output == "42\n" and second.exit_code == 0


def test_ipython_error_has_traceback_without_ansi(ipy: IPythonSession) -> None:
    result = ipy.run("def f():\n    return 1 / 0\nf()")
    assert result.exit_code == 1
    assert "ZeroDivisionError" in result.output
    assert "\x1b[" not in result.output
    assert result.error is not None


def test_ipython_timeout_interrupts_and_keeps_state(ipy: IPythonSession) -> None:
    ipy.run("kept = 'yes'")
    result = ipy.run("import time\nprint('before', flush=True)\ntime.sleep(60)\nprint('ne' + 'ver')", timeout_s=1)
    assert result.timed_out and result.exit_code is None
    assert "before" in result.output and "\nnever" not in result.output
    assert "KeyboardInterrupt" in result.output
    after = ipy.run("kept")
    assert after.output == "'yes'\n"
    assert "KeyboardInterrupt" not in after.output


def test_ipython_kernel_death_is_reported_and_recovered(tmp_path) -> None:
    session = IPythonSession(cwd=str(tmp_path))
    try:
        session.run("y = 1")
        died = session.run("import os; os._exit(1)")
        assert died.error is not None and "died" in died.error
        after = session.run("y")
        assert after.exit_code == 1 and "NameError" in after.output
    finally:
        session.close()


def test_strip_ansi_removes_colour_codes() -> None:
    assert strip_ansi("\x1b[0;31mError\x1b[0m: x") == "Error: x"


def test_ipython_kernel_cuts_a_flood_and_the_limit_stops_the_cell(tmp_path) -> None:
    session = IPythonSession(cwd=str(tmp_path), output_cap_bytes=1000, output_limit_bytes=2_000_000)
    try:
        assert session.run("kept = 1").ok
        flood = session.run("while True: print('z' * 99)", timeout_s=60)
        assert flood.info["output_limit_hit"] is True and not flood.timed_out and flood.exit_code is None
        assert flood.truncated and len(flood.output) < 1100 and flood.output.startswith("zzz")
        assert flood.info["output_bytes"] > 2_000_000
        # A cut the kernel made is counted like one made here, and the tail survives.
        lines = session.run("for i in range(100_000): print(i)")
        assert lines.ok and lines.output.startswith("0\n1\n") and lines.output.endswith("99998\n99999\n")
        assert lines.info["output_bytes"] == sum(len(f"{i}\n") for i in range(100_000))
        shell = session.run("import os; os.system('yes')", timeout_s=60)  # a child writing to fd 1
        assert shell.info["output_limit_hit"] is True
        big = session.run("'q' * 10_000_000")  # a repr is cut in the kernel, before it is sent
        assert big.ok and "characters omitted" in big.output and len(big.output) < 1000
        assert session.run("kept + 1").output == "2\n"
    finally:
        session.close()
