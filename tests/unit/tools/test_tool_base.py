from __future__ import annotations

from farm.tools.base import OutputBuffer, ToolResult, truncate_text


def test_output_buffer_keeps_short_output_whole() -> None:
    buf = OutputBuffer(cap_bytes=100)
    buf.write(b"hello ")
    buf.write(b"world")
    assert buf.render() == ("hello world", False)


def test_output_buffer_keeps_head_and_tail_and_marks_the_cut() -> None:
    buf = OutputBuffer(cap_bytes=20)
    for i in range(1000):
        buf.write(f"{i:04d}\n".encode())
    text, truncated = buf.render()
    assert truncated
    assert text.startswith("0000\n0001")
    assert text.endswith("0998\n0999\n")
    omitted = 1000 * 5 - 20
    assert f"[... {omitted} bytes of output omitted ...]" in text


def test_output_buffer_memory_stays_bounded() -> None:
    buf = OutputBuffer(cap_bytes=64)
    for _ in range(10_000):
        buf.write(b"x" * 100)
    assert len(buf._head) + len(buf._tail) <= 3 * 64
    assert buf.total == 1_000_000


def test_truncate_text_short_text_is_untouched() -> None:
    assert truncate_text("abc", cap_bytes=10) == ("abc", False)


def test_tool_result_round_trips_through_dict() -> None:
    result = ToolResult(output="o", exit_code=None, timed_out=True, error="e", truncated=True, info={"k": 1})
    assert ToolResult.from_dict(result.to_dict()) == result


def test_tool_result_observation_mentions_failures() -> None:
    obs = ToolResult(output="partial", exit_code=None, timed_out=True, error="timed out after 1 s").to_observation()
    assert "partial" in obs and "timed out" in obs
    assert "[exit code 2]" in ToolResult(output="", exit_code=2).to_observation()
    assert ToolResult(output="fine").ok


def test_output_buffer_over_limit_only_past_the_limit() -> None:
    buf = OutputBuffer(cap_bytes=10, limit_bytes=100)
    buf.write(b"x" * 100)
    assert not buf.over_limit
    buf.write(b"x")
    assert buf.over_limit
    assert not OutputBuffer(cap_bytes=10).over_limit


def test_output_buffer_skip_counts_bytes_cut_upstream_and_keeps_what_follows() -> None:
    buf = OutputBuffer(cap_bytes=8)
    buf.write(b"head")
    buf.write(b"-mid")
    buf.skip(1000)
    buf.write(b"tail")
    text, truncated = buf.render()
    assert truncated
    assert text == "head" + "\n[... 1004 bytes of output omitted ...]\n" + "tail"


def test_output_buffer_annotate_says_how_much_was_dropped() -> None:
    buf = OutputBuffer(cap_bytes=10)
    buf.write(b"y\n" * 1000)
    info: dict[str, object] = {}
    buf.annotate(info)
    assert info == {"output_bytes": 2000, "omitted_bytes": 1990}
    short = OutputBuffer(cap_bytes=10)
    short.write(b"ok")
    info = {}
    short.annotate(info)
    assert info == {}
