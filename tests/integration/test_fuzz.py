"""schemathesis against the real API (opt-in: ``--run-fuzz``; build its environment with
``scripts/setup_schemathesis.sh``).

``farm api`` (uvicorn) serves a PostgreSQL database of its own and the test Redis database; the
schemathesis CLI from its own virtual environment runs every phase (examples, coverage, fuzzing,
stateful, which follows the spec's OpenAPI links from a submitted batch or backend to the routes
that read it) with ``--checks all``, as a new user would, and must find nothing. Server errors are
counted from the API's own access log, independently of schemathesis.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from farm.llm.builtin.testing import free_port

pytestmark = [pytest.mark.integration, pytest.mark.fuzz, pytest.mark.timeout(900)]

REPO = Path(__file__).resolve().parents[2]
VENV = Path(os.environ.get("FARM_SCHEMATHESIS_VENV", REPO / ".venv-schemathesis"))
CONFIG = Path(__file__).with_name("schemathesis.toml")
TOKEN = "fuzz-token"
#: examples per operation and phase: ~6,600 cases over the 14 operations, ~1.5 minutes on 2 cores
#: (operations with few possible inputs run out of new ones before that).
MAX_EXAMPLES = int(os.environ.get("FARM_FUZZ_MAX_EXAMPLES", "600"))
#: of the spec's own seven links (POST /v1/batches to its five reads, POST /v1/backends to its two),
#: how many the stateful phase must follow: which it reaches depends on the cases the spec's
#: schemas generate (7 in one run, 5 in another after a route was added).
MIN_LINKS_COVERED = 5
MIN_CASES = 5000
SEED = int(os.environ.get("FARM_FUZZ_SEED", "20261122"))
ACCESS_LINE = re.compile(r'"(?P<method>[A-Z]+) (?P<path>\S+) HTTP/[\d.]+" (?P<status>\d{3})')


@pytest.fixture
def api_url(tmp_path: Path, postgres_url: str, redis_url: str, redis_client: object) -> Iterator[tuple[str, Path]]:
    """``farm api`` on a free port, over a database of its own; yields its URL and its log file."""
    from farm.testing import temporary_database

    with temporary_database(postgres_url, prefix="farm_fuzz") as database_url:
        port = free_port()
        env = {
            **os.environ,
            "PYTHONPATH": str(REPO),
            "FARM_DATA_DIR": str(tmp_path / "data"),
            "FARM_DATABASE__URL": database_url,
            "FARM_REDIS__URL": redis_url,
            "FARM_API__TOKEN": TOKEN,
            "FARM_API__PORT": str(port),
            "FARM_API__HOST": "127.0.0.1",
            # Keeps a fuzzed batch small: the limit is enforced (422), and the fuzzer meets it.
            "FARM_API__MAX_TASKS_PER_BATCH": "50",
            # A results long-poll of a batch no worker runs holds until this bound; keep it short.
            "FARM_API__MAX_WAIT_S": "0.5",
        }
        log_path = tmp_path / "api.log"
        with open(log_path, "wb") as log:
            proc = subprocess.Popen([sys.executable, "-m", "farm", "api"], stdout=log, stderr=log, env=env)
        url = f"http://127.0.0.1:{port}"
        try:
            deadline = time.monotonic() + 60
            while True:
                if proc.poll() is not None:
                    pytest.fail(f"farm api exited with {proc.returncode}: {log_path.read_text()[-3000:]}")
                try:
                    if httpx.get(f"{url}/readyz", timeout=2).status_code == 200:
                        break
                except httpx.HTTPError:
                    pass
                if time.monotonic() > deadline:
                    pytest.fail(f"farm api did not become ready: {log_path.read_text()[-3000:]}")
                time.sleep(0.2)
            yield url, log_path
        finally:
            proc.terminate()
            try:
                proc.wait(30)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()


def test_fuzz_api_finds_no_failure(api_url: tuple[str, Path], tmp_path: Path) -> None:
    schemathesis = VENV / "bin" / "schemathesis"
    if not schemathesis.exists():
        pytest.skip(f"no schemathesis environment at {VENV}: run scripts/setup_schemathesis.sh")
    url, log_path = api_url
    report = tmp_path / "report.json"
    # One worker: two share hypothesis' lambda-source cache across threads, which trips a CPython
    # 3.11 ast bug ("AST constructor recursion depth mismatch") now and then.
    cmd = [str(schemathesis), "--config-file", str(CONFIG), "--no-color", "run", f"{url}/openapi.json"]
    cmd += ["--checks", "all", "--header", f"Authorization: Bearer {TOKEN}", "--workers", "1"]
    cmd += ["--max-examples", str(MAX_EXAMPLES), "--seed", str(SEED), "--generation-database", "none"]
    cmd += ["--report", "json", "--report-json-path", str(report)]
    started = time.monotonic()
    run = subprocess.run(cmd, capture_output=True, text=True, cwd=tmp_path, timeout=840)
    seconds = time.monotonic() - started

    cases = _cases_generated(run.stdout)
    scenarios, links = _stateful(run.stdout)
    answers = [m for m in map(ACCESS_LINE.search, log_path.read_text(errors="replace").splitlines()) if m]
    server_errors = [f"{m['method']} {m['path']} -> {m['status']}" for m in answers if m["status"] >= "500"]
    summary = (
        f"schemathesis: {cases} cases ({scenarios} stateful scenarios over {links} links), {len(answers)} "
        f"requests, exit {run.returncode}, {len(server_errors)} server errors, {seconds:.0f} s; "
        f"command: {' '.join(cmd)}"
    )
    print(summary)
    print(run.stdout[-4000:])
    assert run.returncode == 0, f"{summary}\n{run.stdout[-20000:]}\n{run.stderr[-3000:]}"
    assert not server_errors, f"{summary}\n" + "\n".join(server_errors[:20])
    assert cases >= MIN_CASES, summary
    assert scenarios > 0 and links >= MIN_LINKS_COVERED, f"the stateful phase followed too little: {summary}"
    assert json.loads(report.read_text())["test_cases"]["generated"] == cases


def _cases_generated(stdout: str) -> int:
    """From the summary's ``Test cases:`` section: ``N generated, ...``."""
    match = re.search(r"Test cases:\s*\n\s*(\d+) generated", stdout)
    assert match, f"no case count in schemathesis output:\n{stdout[-3000:]}"
    return int(match.group(1))


def _stateful(stdout: str) -> tuple[int, int]:
    """From the stateful phase's section: scenarios run and API links covered."""
    match = re.search(r"Scenarios:\s*(\d+)\s*\n\s*API Links:\s*(\d+) covered", stdout)
    assert match, f"no stateful phase in schemathesis output:\n{stdout[-3000:]}"
    return int(match.group(1)), int(match.group(2))
