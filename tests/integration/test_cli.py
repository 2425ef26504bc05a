"""The `farm` command line against a running farm (real API and worker processes)."""

from __future__ import annotations

import html
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from farm.embedded import EmbeddedStack, settings_env
from tests.browser import browse

pytestmark = [pytest.mark.integration, pytest.mark.timeout(180)]


def farm_cli(stack: EmbeddedStack, *args: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("FARM_")}
    env.update(settings_env(stack.settings), COLUMNS="160")
    return subprocess.run([sys.executable, "-m", "farm", *args], env=env, capture_output=True, text=True, timeout=150)


def test_submit_follows_the_batch_and_writes_results(stack: EmbeddedStack, tmp_path: Path):
    tasks = tmp_path / "tasks.jsonl"
    tasks.write_text("\n".join(json.dumps({"type": "echo", "config": {"text": f"cli {i}"}}) for i in range(3)) + "\n")
    out = tmp_path / "results.jsonl"

    result = farm_cli(stack, "submit", str(tasks), "--group-size", "2", "--seed", "1", "--out", str(out))

    assert result.returncode == 0, result.stderr
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    assert len(rows) == 6 and all(r["job"]["state"] == "done" for r in rows)
    assert all(isinstance(r["trajectory"]["token_ids"], list) for r in rows)  # JSON arrays in the file
    assert "echo" in result.stdout and "ok 6" in result.stdout  # the closing table is the result
    assert "ok 6" not in result.stderr  # ... and the progress is not


def test_submit_json_is_the_batch_and_its_summary(stack: EmbeddedStack, tmp_path: Path):
    tasks = tmp_path / "tasks.jsonl"
    tasks.write_text(json.dumps({"type": "echo", "config": {"text": "j"}}) + "\n")
    result = farm_cli(stack, "submit", str(tasks), "--group-size", "2", "--json")
    assert result.returncode == 0, result.stderr
    answer = json.loads(result.stdout)
    assert len(answer["batch"]["job_ids"]) == 2
    assert answer["summary"]["echo"]["jobs"] == 2 and answer["summary"]["echo"]["outcomes"] == {"ok": 2}


def test_submit_reports_a_refused_spec(stack: EmbeddedStack, tmp_path: Path):
    tasks = tmp_path / "bad.jsonl"
    tasks.write_text(json.dumps({"type": "nope", "config": {}}) + "\n")
    result = farm_cli(stack, "submit", str(tasks))
    assert result.returncode == 2 and result.stdout == ""
    assert "unknown task type 'nope'" in result.stderr


def test_submit_lists_every_problem_of_the_batch(stack: EmbeddedStack, tmp_path: Path):
    tasks = tmp_path / "bad.jsonl"
    bad = [{"type": "math", "config": {"problem_id": "nope"}}, {"type": "echo", "config": {"text": ""}}]
    tasks.write_text("\n".join(json.dumps(t) for t in bad) + "\n")
    result = farm_cli(stack, "submit", str(tasks))
    assert result.returncode == 2 and result.stdout == ""
    assert "tasks.0.config.problem_id: unknown problem_id 'nope'; GET /v1/tasks?type=math" in result.stderr
    # The client reads the answer's every problem (farm/client/base.py `check`): each a line of its own.
    assert "(and 1 more)" in result.stderr
    assert "\n  tasks.1.config.text: " in result.stderr, result.stderr


def test_submit_rejects_a_file_that_is_not_jsonl(stack: EmbeddedStack, tmp_path: Path):
    tasks = tmp_path / "bad.jsonl"
    tasks.write_text("{not json\n")
    result = farm_cli(stack, "submit", str(tasks))
    assert result.returncode == 2 and "bad.jsonl:1: not JSON" in result.stderr and result.stdout == ""


def test_status_and_cancel(stack: EmbeddedStack, tmp_path: Path):
    tasks = tmp_path / "slow.jsonl"
    tasks.write_text(json.dumps({"type": "echo", "config": {"text": "s", "sleep_s": {"run": 60}}}) + "\n")
    submitted = farm_cli(stack, "submit", str(tasks), "--no-wait")
    # BATCH=$(farm submit --no-wait f.jsonl): the id alone on stdout, the message on stderr.
    assert submitted.returncode == 0 and re.fullmatch(r"\d+\n", submitted.stdout), submitted
    batch_id = submitted.stdout.strip()
    assert f"batch {batch_id}: 1 jobs" in submitted.stderr
    # The farm at a glance while the batch runs: its pools, their queues, the batch's progress.
    node = stack.settings.worker.node
    glance = farm_cli(stack, "status", "--once")
    assert glance.returncode == 0 and glance.stderr == "", glance.stderr
    assert "farm ok" in glance.stdout and "pools" in glance.stdout and "running batches" in glance.stdout
    assert f"run.{node}" in glance.stdout and f"eval.{node}" in glance.stdout
    assert re.search(rf"^\W*{batch_id}\W.*0/1", glance.stdout, re.M), glance.stdout
    assert all(column in glance.stdout for column in ("reward", "tokens/s", "time left")), glance.stdout
    overview = json.loads(farm_cli(stack, "status", "--json").stdout)
    assert {w["name"] for w in overview["workers"]} >= {f"init@{node}", f"run@{node}", f"eval@{node}"}
    assert int(batch_id) in [b["id"] for b in overview["batches"]]
    # The connection budget: each worker's pools (farm.db.budget) and this API's, against the server's limit.
    assert all(w["db_connections"] == 3 for w in overview["workers"]), overview["workers"]
    database = overview["database"]
    assert database["budget"] == 22 + 3 * len(overview["workers"]) and database["max_connections"] > 0
    assert f"database connections: budget {database['budget']}" in " ".join(glance.stdout.split())
    # One batch: a summary a reader reads, and the API's answer with --json.
    summary = farm_cli(stack, "status", batch_id)
    assert summary.returncode == 0 and re.search(r"state\s+running", summary.stdout), summary.stdout
    assert re.search(r"jobs\s+0/1 finished", summary.stdout), summary.stdout
    assert re.search(r"reward\s+- \(no job scored yet\)", summary.stdout) and "running for" in summary.stdout
    assert json.loads(farm_cli(stack, "status", batch_id, "--json").stdout)["id"] == int(batch_id)
    cancelled = farm_cli(stack, "cancel", batch_id, "--json")
    assert cancelled.returncode == 0 and json.loads(cancelled.stdout)["state"] == "cancelled"
    status = farm_cli(stack, "status", batch_id)
    assert re.search(r"state\s+cancelled", status.stdout) and "cancelled 1" in status.stdout, status.stdout


@pytest.mark.parametrize("args", [("status", "999999"), ("cancel", "999999")])
def test_an_api_error_is_one_clean_line(stack: EmbeddedStack, args: tuple[str, ...]):
    result = farm_cli(stack, *args)
    assert result.returncode == 2 and result.stdout == ""
    assert "Traceback" not in result.stderr and result.stderr.count("\n") <= 2, result.stderr
    assert "404 not_found" in result.stderr and "999999" in result.stderr


def test_an_api_that_is_not_up_is_one_clean_line(tmp_path: Path):
    env = {k: v for k, v in os.environ.items() if not k.startswith("FARM_")}
    result = subprocess.run(
        [sys.executable, "-m", "farm", "status", "--url", "http://127.0.0.1:9"],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 1 and "Traceback" not in result.stderr
    assert "cannot reach the farm API at http://127.0.0.1:9/" in result.stderr


def test_report_draws_the_batch_as_it_ran(stack: EmbeddedStack, tmp_path: Path):
    # Stages that take long enough for the pools to overlap on the timeline.
    sleeps = {"init": 0.3, "run": 0.6, "eval": 0.2}
    tasks = tmp_path / "tasks.jsonl"
    tasks.write_text(
        "\n".join(json.dumps({"type": "echo", "config": {"text": f"r{i}", "sleep_s": sleeps}}) for i in range(4)) + "\n"
    )
    submitted = farm_cli(stack, "submit", str(tasks), "--group-size", "2", "--json")
    assert submitted.returncode == 0, submitted.stderr
    batch_id = str(json.loads(submitted.stdout)["batch"]["id"])
    page = tmp_path / "report.html"

    result = farm_cli(stack, "report", batch_id, "--out", str(page))

    assert result.returncode == 0, result.stderr
    assert result.stdout.splitlines() == [str(page), str(page.with_suffix(".png"))]  # what it wrote, for a script
    assert page.with_suffix(".png").stat().st_size > 20_000
    text = page.read_text()
    assert "<script" not in text and 'src="http' not in text  # self-contained: nothing to fetch
    dom = browse(page.as_uri(), screenshot=tmp_path / "shown.png")
    assert dom.count("<svg") == 3 and "8 jobs" in dom and "done 8" in dom
    row = re.search(r"<tr><td>echo</td><td>8</td><td>ok 8</td><td>[\d.]+</td>(.*?)</tr>", dom)
    assert row is not None, "the per-type table has no echo row"
    init_s, run_s, eval_s = (float(x) for x in re.findall(r"<td>([\d.]+)</td>", row[1]))
    assert init_s >= 0.3 and run_s >= 0.6 and eval_s >= 0.2  # each stage's recorded duration, not its waits
    # Laid out for a reader, as the browser draws it: the time figure the width of the page, the
    # per-type figures side by side under it, each half of it (not three small charts on the left).
    boxes = _layout(page, tmp_path)
    timeline, outcomes, rewards = boxes["timeline"], boxes["outcomes"], boxes["rewards"]
    assert timeline["width"] > 0.9 * boxes["body"]["width"]
    assert outcomes["top"] >= timeline["bottom"] and abs(outcomes["top"] - rewards["top"]) < 2
    assert outcomes["right"] <= rewards["left"] and min(outcomes["width"], rewards["width"]) > 0.4 * timeline["width"]


def _layout(page: Path, tmp_path: Path) -> dict[str, dict[str, float]]:
    """The report's figures' boxes as Chromium lays them out (a copy of the page with a script that
    writes them into the DOM: the report itself has none)."""
    measure = """<script>
const box = (el) => { const r = el.getBoundingClientRect();
  return {top: r.top, bottom: r.bottom, left: r.left, right: r.right, width: r.width}; };
const out = {body: box(document.body)};
for (const id of ["timeline", "outcomes", "rewards"]) out[id] = box(document.getElementById(id));
const pre = document.createElement("pre"); pre.id = "layout"; pre.textContent = JSON.stringify(out);
document.body.appendChild(pre);
</script></body>"""
    copy = tmp_path / "measured.html"
    copy.write_text(page.read_text().replace("</body>", measure))
    dom = browse(copy.as_uri(), screenshot=tmp_path / "measured.png", until=lambda d: 'id="layout"' in d)
    found = re.search(r'<pre id="layout">(.*?)</pre>', dom)
    assert found is not None, "the layout script did not run"
    boxes: dict[str, dict[str, float]] = json.loads(html.unescape(found[1]))
    return boxes
