"""The farm on a real Slurm cluster, as a cluster user runs it: slurm/head.sbatch (its own PostgreSQL
and Redis, the API), a node array of slurm/node.sbatch (a worker per stage, bwrap sandboxes, the
built-in CPU backend), a mixed batch through farm.client, then scancel and nothing left.

Opt-in (``--run-slurm``): it installs Slurm if missing and runs daemons as root. It prints one
``SLURM`` line with its phases' seconds.
"""

from __future__ import annotations

import functools
import re
import subprocess
import time
from collections import Counter
from pathlib import Path
from typing import Any

import httpx
import pytest

from farm.client import FarmClient
from farm.constants import POLICY_OUTCOMES, JobState
from farm.llm.builtin.tiny import make_tiny
from tasks.code.dataset import list_problems as code_problems
from tasks.math.dataset import list_problems as math_problems
from tests.slurm.cluster import SlurmCluster

pytestmark = [pytest.mark.slurm, pytest.mark.timeout(600)]

SLURM_DIR = Path(__file__).resolve().parents[2] / "slurm"
NODES = 2
#: how long the head may take to publish farm.env, and the nodes to join.
START_TIMEOUT_S = 180.0
#: tokens a turn of the batch cancelled in flight may sample: 30 s at the backend's 20 ms a step.
LONG_TURN_TOKENS = 1500
#: the farm's settings a cluster user reads from farm.env.
PUBLISHED = ("FARM_HEAD_JOB_ID", "FARM_API_URL", "FARM_API__TOKEN", "FARM_REDIS__URL", "FARM_DATABASE__URL")


def mixed_tasks() -> list[dict[str, Any]]:
    return [
        {"type": "math", "config": {"problem_id": math_problems()[0].id}},
        {"type": "code", "config": {"problem_id": code_problems()[0].id, "max_turns": 2}},
        {"type": "swe", "config": {"instance_id": "rollout-farm__semver-1", "max_turns": 2}},
        {"type": "harbor", "config": {"example": "hello-file", "max_turns": 2}},
    ]


def read_published(path: Path) -> dict[str, str]:
    """farm.env as a cluster user's shell sees it once sourced."""
    names = " ".join(f'"${name}"' for name in PUBLISHED)
    out = subprocess.run(
        ["bash", "-c", f"source {path} && printf '%s\\0' {names}"], capture_output=True, text=True, check=True
    ).stdout
    return dict(zip(PUBLISHED, out.split("\0")[: len(PUBLISHED)], strict=True))


def wait_for(predicate: Any, *, what: str, cluster: SlurmCluster, logs: Path, timeout_s: float = START_TIMEOUT_S):
    """Poll until ``predicate()`` is truthy, failing with the jobs' logs if it never is or a job ended."""
    deadline = time.monotonic() + timeout_s
    submitted = base_ids(cluster)
    while time.monotonic() < deadline:
        if value := predicate():
            return value
        if ended := submitted - base_ids(cluster):
            pytest.fail(f"job(s) {sorted(ended)} ended while waiting for {what}:\n{logs_tail(cluster, logs)}")
        time.sleep(0.5)
    pytest.fail(f"timed out after {timeout_s}s waiting for {what}:\n{logs_tail(cluster, logs)}")


def base_ids(cluster: SlurmCluster) -> set[str]:
    """Jobs Slurm still shows, an array as one (``12_[0-1]`` pending, ``12_0`` running: ``12``)."""
    return {job.split("_")[0] for job in cluster.jobs()}


def logs_tail(cluster: SlurmCluster, logs: Path, lines: int = 15) -> str:
    parts = [cluster.log_tail(lines)]
    for path in sorted(logs.rglob("*.log")):
        tail = path.read_text(errors="replace").splitlines()[-lines:]
        parts.append(f"--- {path.relative_to(logs)}\n" + "\n".join(tail))
    return "\n".join(parts)


def mounts_under(root: Path) -> list[str]:
    """Mount points under ``root`` (sandboxes' disk images are loop-mounted there)."""
    with open("/proc/self/mounts") as mounts:
        points = [line.split()[1] for line in mounts]
    return [p for p in points if p == str(root) or p.startswith(f"{root}/")]


def healthy_backends(api_url: str, token: str) -> list[dict[str, Any]]:
    try:
        answer = httpx.get(f"{api_url}/v1/backends", headers={"Authorization": f"Bearer {token}"}, timeout=5)
    except httpx.HTTPError:
        return []
    return [b for b in answer.json() if b["healthy"]] if answer.status_code == 200 else []


def test_farm_on_slurm_runs_a_mixed_batch_and_scancel_leaves_nothing(slurm_cluster: SlurmCluster) -> None:
    cluster = slurm_cluster
    shared = cluster.root / "shared"
    logs = shared / "logs"
    seconds: dict[str, float] = {}
    started = time.monotonic()
    # Given a farm on Slurm: the head job and a node array, each sized for one CPU of this machine.
    make_tiny(shared / "tiny-model")  # what `farm llm make-tiny $FARM_SHARED/tiny-model` makes
    env = {
        "FARM_SHARED": str(shared),
        "FARM_SANDBOX__DRIVER": "bwrap",  # Apptainer on a real cluster; none on this machine
        "FARM_NODE_LLM": "builtin",
        "FARM_LLM__BUILTIN_MODEL_DIR": str(shared / "tiny-model"),
        "FARM_NODE_STOP_S": "10",
        # A decode step lasts 20 ms: a short turn takes a second, a long one stays in flight.
        "FARM_LLM__BUILTIN_STEP_TIME_MS": "20",
    }
    head = cluster.sbatch(SLURM_DIR / "head.sbatch", "--cpus-per-task=1", "--mem=1G", env=env)
    nodes = cluster.sbatch(
        SLURM_DIR / "node.sbatch", f"--array=0-{NODES - 1}", "--cpus-per-task=1", "--mem=2G", env=env
    )
    wait_for(lambda: (shared / "farm.env").is_file(), what="the head's farm.env", cluster=cluster, logs=logs)
    farm = read_published(shared / "farm.env")
    assert farm["FARM_HEAD_JOB_ID"] == head
    seconds["head_up"] = time.monotonic() - started
    backends = wait_for(
        lambda: len(b := healthy_backends(farm["FARM_API_URL"], farm["FARM_API__TOKEN"])) == NODES and b,
        what=f"{NODES} nodes' built-in backends in the balancer",
        cluster=cluster,
        logs=logs,
    )
    node_names = {b["id"].removeprefix("builtin@") for b in backends}
    assert all(re.fullmatch(r"farmnode-j\d+", name) for name in node_names), node_names
    for name in node_names:
        # Each node sized itself from its allocation (sbatch's --cpus-per-task and --mem). The node
        # says so right after it registered its backend: the line may land a moment after the
        # balancer shows the backend, so it is waited for, not read once.
        line = f"node {name} is up: 1 cpus, 2048 MB"
        job = name.split("-j")[1]
        said = functools.partial(lambda line, job: line in cluster.job_output(job), line, job)
        wait_for(said, what=repr(line), cluster=cluster, logs=logs, timeout_s=30)
    seconds["nodes_up"] = time.monotonic() - started

    # When a mixed batch runs through the client library
    with FarmClient(farm["FARM_API_URL"], token=farm["FARM_API__TOKEN"]) as client:
        batch = client.submit(mixed_tasks(), group_size=2, sampling={"temperature": 1.0, "max_tokens": 40, "seed": 5})
        results = list(client.results(batch.id, wait_s=10, encoding="json"))
        jobs = [client.job(r.job.id) for r in results]
    seconds["batch"] = time.monotonic() - started - seconds["nodes_up"]

    # Then every job ends done with its trajectory, each on one node of the array
    assert len(results) == len(mixed_tasks()) * 2
    for r in results:
        assert r.job.state is JobState.DONE, (r.job.type, r.job.outcome, r.job.reason, logs_tail(cluster, logs))
        assert r.job.outcome in POLICY_OUTCOMES
        assert r.trajectory is not None and r.trajectory.reward is not None
        assert isinstance(r.trajectory.token_ids, list) and isinstance(r.trajectory.loss_mask, list)
        assert r.trajectory.num_tokens == len(r.trajectory.token_ids) > 0 and 1 in r.trajectory.loss_mask
    for job in jobs:
        # A job's RUN and EVAL ran where its INIT made the sandbox: one node, one of the array's.
        assert {s.node for s in job.stages} <= node_names and len({s.node for s in job.stages}) == 1, job.stages
    spread = Counter(job.node for job in jobs)
    ready = httpx.get(f"{farm['FARM_API_URL']}/readyz", timeout=10)
    assert ready.status_code == 200, ready.text  # database, Redis, both nodes' sandbox self-checks

    # When everything is cancelled while another batch's episodes run in their sandboxes
    with FarmClient(farm["FARM_API_URL"], token=farm["FARM_API__TOKEN"]) as client:
        code = {"type": "code", "config": {"problem_id": code_problems()[0].id, "max_turns": 4}}
        long = client.submit([code], group_size=4, sampling={"temperature": 1.0, "max_tokens": LONG_TURN_TOKENS})
        wait_for(
            lambda: client.status(long.id).counts.get(JobState.RUN, 0) >= 2,
            what="episodes running",
            cluster=cluster,
            logs=logs,
        )
    cancelled = time.monotonic()
    cluster.scancel(head, nodes)
    cluster.wait_jobs_gone()
    seconds["scancel"] = time.monotonic() - cancelled

    # Then nothing of the farm is left: no process, no mount, no published settings, no node-local files
    assert cluster.job_processes() == {}, logs_tail(cluster, logs)
    assert mounts_under(cluster.root) == [], logs_tail(cluster, logs)
    assert not (shared / "farm.env").exists()
    assert sorted(p.name for p in cluster.job_tmp.iterdir()) == [], logs_tail(cluster, logs)
    # Each node's exit reaped what its killed workers left (a job past INIT keeps its sandbox).
    reap_logs = [logs / f"node-{name.split('-j')[1]}" / "reap.log" for name in node_names]
    reaped = sum(int(re.findall(r"reaped (\d+)", path.read_text())[-1]) for path in reap_logs)
    seconds["total"] = time.monotonic() - started
    figures = " ".join(f"{k}={v:.1f}s" for k, v in seconds.items())
    print(f"SLURM {len(results)} jobs on {len(node_names)} nodes {dict(spread)}, {reaped} sandboxes reaped, {figures}")
