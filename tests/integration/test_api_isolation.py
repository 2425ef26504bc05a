"""The API process loads task schemas, never agent, sandbox or tool code.

The test process itself imports all of those, so the app runs in a child process: it starts,
serves its OpenAPI spec, lists the handlers and the shipped tasks, and accepts a batch holding
a task of every installed task type; then it names the forbidden modules it holds.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.integration

#: module prefixes the API must never import, and the handler modules of the task families.
FORBIDDEN_PREFIXES = ("farm.sandbox", "farm.agent", "farm.tools")
FORBIDDEN_PATTERN = r"^tasks\.[A-Za-z_0-9]+\.handler$"

CHILD = r"""
import json, re, sys

from fastapi.testclient import TestClient

from farm.api.app import create_app
from farm.config import Settings
from farm.handlers.registry import known_handlers

args = json.loads(sys.argv[1])
settings = Settings(
    data_dir=args["data_dir"], database={"url": args["db"]}, redis={"url": args["redis"]}, api={"token": "t"}
)
auth = {"Authorization": "Bearer t"}
# The task types without a shipped dataset get a config of their own.
configs = {
    "echo": {"text": "hi"},
    "generate": {"messages": [{"role": "user", "content": "hi"}]},
    "harness": {"task": {"type": "harbor", "config": {"example": "hello-file"}}},
    "swe-image": {
        "image": "/images/instance.tar",
        "instance": {
            "instance_id": "a__b-1", "repo": "a/b", "base_commit": "0123456", "problem_statement": "fix it",
            "test_cmd": "pytest -rA", "FAIL_TO_PASS": ["t.py::test_x"],
        },
    },
}
with TestClient(create_app(settings)) as client:
    assert client.get("/openapi.json").status_code == 200
    handlers = client.get("/v1/handlers", headers=auth).json()
    assert all(h["config_schema"] for h in handlers), handlers
    for family in client.get("/v1/tasks", headers=auth).json():
        configs[family["type"]] = family["tasks"][0]["config"]
    tasks = [{"type": name, "config": config} for name, config in sorted(configs.items())]
    submitted = client.post("/v1/batches", json={"tasks": tasks}, headers=auth)
    assert submitted.status_code == 201, submitted.text
    bad = client.post("/v1/batches", json={"tasks": [{"type": "math", "config": {"nope": 1}}]}, headers=auth)
    assert bad.status_code == 422, bad.text
print(json.dumps({
    "types": sorted(configs),
    "installed": sorted(known_handlers()),
    "jobs": len(submitted.json()["job_ids"]),
    "forbidden": sorted(
        m for m in sys.modules
        if m.startswith(tuple(args["prefixes"])) or re.match(args["pattern"], m)
    ),
}))
"""


def test_api_submits_every_task_type_without_importing_handlers(
    tmp_path: Path, pg_url: str, redis_url: str, redis_client: object
) -> None:
    # Given an API process that serves its spec, its handlers, its tasks and a submit of every type
    args = {
        "data_dir": str(tmp_path),
        "db": pg_url,
        "redis": redis_url,
        "prefixes": FORBIDDEN_PREFIXES,
        "pattern": FORBIDDEN_PATTERN,
    }
    done = subprocess.run([sys.executable, "-c", CHILD, json.dumps(args)], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-4000:]
    report = json.loads(done.stdout.strip().splitlines()[-1])
    # Then every installed task type was submitted, and none of their handlers was imported
    assert report["types"] == report["installed"]
    assert report["jobs"] == len(report["installed"])
    assert {"math", "code", "swe", "harbor"} <= set(report["types"])
    assert report["forbidden"] == []
