"""A real headless Chromium for the pages the farm serves or writes (Flower, `farm report`)."""

from __future__ import annotations

import shutil
import subprocess
import time
from collections.abc import Callable
from pathlib import Path

from tests.conftest import service_missing


def chromium() -> str:
    path = shutil.which("chromium") or shutil.which("chromium-browser")
    if path is None:
        service_missing("headless Chromium (Debian package chromium)", FileNotFoundError("chromium"))
    assert path is not None
    return path


def browse(url: str, *, screenshot: Path, until: Callable[[str], bool] | None = None, timeout_s: float = 60) -> str:
    """The page's DOM once its scripts ran (virtual time lets its AJAX tables fill), and a screenshot.

    With `until`, the DOM is dumped again until it holds: on a loaded machine the virtual-time budget
    can run out before a page's AJAX answer arrives, which leaves a table empty for that one dump."""
    common = [
        chromium(),
        "--headless",
        "--no-sandbox",
        "--disable-gpu",
        "--disable-quic",
        "--no-first-run",
        "--disable-background-networking",
        "--disable-component-update",
        "--disable-sync",
        "--virtual-time-budget=8000",
        "--window-size=1400,900",
    ]
    deadline = time.monotonic() + timeout_s
    while True:
        dom = subprocess.run([*common, "--dump-dom", url], capture_output=True, text=True, timeout=90, check=True)
        if until is None or until(dom.stdout) or time.monotonic() > deadline:
            break
        time.sleep(1)
    subprocess.run([*common, f"--screenshot={screenshot}", url], capture_output=True, timeout=90, check=True)
    assert screenshot.stat().st_size > 10_000, "the screenshot is blank"
    return dom.stdout
