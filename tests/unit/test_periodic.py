"""``farm.periodic.Periodic``: the thread under the health checker and the weight-update re-drive."""

from __future__ import annotations

import logging
import threading

import pytest

from farm.periodic import Periodic

log = logging.getLogger(__name__)


def _counting(calls: list[int], *, until: int, done: threading.Event, fail: bool = False):
    def tick() -> None:
        calls.append(len(calls))
        if len(calls) >= until:
            done.set()
        if fail:
            raise RuntimeError("a database hiccup")

    return tick


def test_periodic_a_failing_tick_is_logged_and_the_next_one_runs(caplog: pytest.LogCaptureFixture):
    calls: list[int] = []
    done = threading.Event()
    tick = _counting(calls, until=3, done=done, fail=True)
    periodic = Periodic(tick, interval_s=0.01, name="test-periodic", what="the chore", log=log)
    periodic.start()
    try:
        assert done.wait(10), f"ticks stopped after {len(calls)}"
    finally:
        periodic.stop()
    assert "the chore failed" in caplog.messages


def test_periodic_waits_one_interval_before_the_first_tick_unless_at_start():
    for at_start, expected in ((False, []), (True, [0])):
        calls: list[int] = []
        done = threading.Event()
        periodic = Periodic(
            _counting(calls, until=1, done=done), interval_s=3600, name="t", what="t", log=log, at_start=at_start
        )
        periodic.start()
        done.wait(0.5 if at_start else 0.2)
        periodic.stop()
        assert calls == expected


def test_periodic_stop_ends_the_thread_and_start_runs_it_again():
    calls: list[int] = []
    done = threading.Event()
    periodic = Periodic(_counting(calls, until=1, done=done), interval_s=0.01, name="t", what="t", log=log)
    periodic.start()
    assert done.wait(10)
    periodic.stop()
    stopped_at = len(calls)
    assert not any(t.name == "t" for t in threading.enumerate())
    done.clear()
    periodic.start()
    assert done.wait(10)
    periodic.stop()
    assert len(calls) > stopped_at
