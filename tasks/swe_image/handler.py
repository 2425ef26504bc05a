"""``swe-image``: a SWE-bench-style instance run in its own image, graded as SWE-bench grades.

The trainer sends the instance record (``instance_id``, ``repo``, ``base_commit``,
``problem_statement``, the test command, ``FAIL_TO_PASS`` / ``PASS_TO_PASS``, an optional hidden
``test_patch``) and the instance's image (a file on the nodes: a docker-save archive, an OCI
layout or archive; or a Dockerfile to build). The image holds the repository at its base commit
with its dependencies installed, at ``workdir`` (``/testbed`` in SWE-bench's images); the agent
works there. At the end of RUN its diff from the base commit is taken inside the sandbox. EVAL
starts a fresh sandbox of the image, applies that diff and the ``test_patch``, runs the test
command and reads one status per test from its log, as SWE-bench's pytest log parser does (a line
starting with ``PASSED``/``FAILED``/``ERROR``/``SKIPPED``/``XFAIL`` and the test's id). The instance
is resolved, reward 1, when every test of ``FAIL_TO_PASS`` and ``PASS_TO_PASS`` passed; else 0.
"""

from __future__ import annotations

import asyncio
import shlex
from pathlib import Path
from typing import Any

from farm.agent.handler import AgentHandler
from farm.agent.loop import Episode
from farm.agent.toolbox import system_prompt
from farm.errors import SandboxError
from farm.handlers.base import StageContext
from farm.sandbox.base import Sandbox, SandboxSpec
from farm.schemas import EvalResult, TrajectoryData
from tasks.swe.handler import _GIT, PATCH_FILE, SweState, diff_command
from tasks.swe_image.config import SweImageConfig, SweImageInstance

#: statuses SWE-bench's log parser reads; a test passes with the first two.
STATUSES = ("PASSED", "FAILED", "SKIPPED", "ERROR", "XFAIL", "XPASS")
PASSING = ("PASSED", "XFAIL")
TEST_LOG = "/tmp/.farm-tests.log"
AGENT_PATCH = "/tmp/.farm-agent.patch"
TEST_PATCH = "/tmp/.farm-test.patch"
SYSTEM = (
    "You are a software engineer fixing an issue in the repository in {workdir} (a git checkout). Find the "
    "cause and edit the source. Do not edit the tests: hidden tests decide whether the issue is resolved. "
    "When the fix is done, call submit."
)


def parse_log(output: str) -> dict[str, str]:
    """Test id -> status from lines ``STATUS test_id ...`` (pytest ``-rA``'s short summary and
    anything that prints the same)."""
    statuses: dict[str, str] = {}
    for line in output.splitlines():
        words = line.split()
        if len(words) >= 2 and words[0] in STATUSES:
            statuses[words[1]] = words[0]
    return statuses


def grade(instance: SweImageInstance, statuses: dict[str, str]) -> tuple[bool, dict[str, str]]:
    """Resolved when every listed test passed; each listed test's status (``MISSING`` if not run)."""
    listed = {t: statuses.get(t, "MISSING") for t in [*instance.FAIL_TO_PASS, *instance.PASS_TO_PASS]}
    return all(s in PASSING for s in listed.values()), listed


class SweImageHandler(AgentHandler[SweImageConfig, SweState]):
    config_class = SweImageConfig
    state_class = SweState
    reverify_safe = True  # EVAL needs only the diff kept in the job's state

    def sandbox_spec(self, config: SweImageConfig) -> SandboxSpec:
        return SandboxSpec(image=config.image, workdir=config.workdir)

    def workspace_files(self, config: SweImageConfig, dest: Path) -> dict[str, Any]:
        return {"base_commit": config.instance.base_commit}  # the files are the image's

    def messages(self, config: SweImageConfig, state: SweState, specs: list[dict[str, Any]]) -> list[dict[str, Any]]:
        instance = config.instance
        task = (
            f"You are working in a checkout of {instance.repo}. Resolve this issue by editing the source code; "
            f"the hidden tests will be run after you finish.\n\n<issue>\n{instance.problem_statement.strip()}\n</issue>"
        )
        system = system_prompt(SYSTEM.format(workdir=config.workdir), specs)
        return [{"role": "system", "content": system}, {"role": "user", "content": task}]

    def collect(
        self, config: SweImageConfig, state: SweState, sandbox: Sandbox | None, episode: Episode
    ) -> dict[str, Any]:
        assert sandbox is not None
        result = sandbox.run(["bash", "-c", diff_command(config.instance.base_commit)], timeout_s=120)
        if not result.ok:
            return {"patch": None, "patch_error": result.output[-1000:] or str(result.error)}
        return {"patch": sandbox.get_file(PATCH_FILE).decode("utf-8", errors="replace")}

    async def evaluate(
        self, config: SweImageConfig, state: SweState, trajectory: TrajectoryData, ctx: StageContext
    ) -> EvalResult:
        return await asyncio.to_thread(self._grade, config, state, ctx)

    def _grade(self, config: SweImageConfig, state: SweState, ctx: StageContext) -> EvalResult:
        instance = config.instance
        if state.patch is None:
            why = f"no diff could be taken from the agent's checkout: {state.patch_error or ''}"
            return EvalResult(reward=0.0, metrics={"resolved": 0.0}, info={"swe": {"reason": why}})
        spec = self.sandbox_spec(config).model_copy(update={"label": f"job {ctx.job_id} eval"})
        with ctx.sandboxes.create(spec) as sandbox:
            # A fresh copy of the image: nothing the agent left running or wrote but its diff reaches it.
            sandbox.put_file(AGENT_PATCH, state.patch.encode())
            sandbox.put_file(TEST_PATCH, instance.test_patch.encode())
            apply = (
                f"{_GIT} checkout -q {shlex.quote(instance.base_commit)} && "
                f"if [ -s {AGENT_PATCH} ]; then {_GIT} apply --binary {AGENT_PATCH}; fi"
            )
            applied = sandbox.run(["bash", "-c", apply], timeout_s=120)
            if not applied.ok:
                info = {"reason": "the agent's diff does not apply", "output": applied.output[-2000:]}
                return EvalResult(reward=0.0, metrics={"resolved": 0.0}, info={"swe": info})
            # The hidden tests go over the agent's diff (which may not touch them: they win).
            tests = f"if [ -s {TEST_PATCH} ]; then {_GIT} apply --binary {TEST_PATCH} || exit 90; fi"
            command = f"{tests}; ({instance.test_cmd}) > {TEST_LOG} 2>&1"
            result = sandbox.run(["bash", "-c", command], timeout_s=config.test_timeout_s)
            if result.exit_code == 90:  # the agent's diff touched what the hidden tests change
                info = {
                    "reason": "the hidden tests do not apply over the agent's diff",
                    "output": result.output[-2000:],
                }
                return EvalResult(reward=0.0, metrics={"resolved": 0.0}, info={"swe": info})
            try:
                log = sandbox.get_file(TEST_LOG).decode("utf-8", errors="replace")
            except SandboxError as exc:
                raise SandboxError(f"the tests wrote no log: {result.output[-500:]!r}", job_id=ctx.job_id) from exc
        resolved, listed = grade(instance, parse_log(log))
        verdict: dict[str, Any] = {"resolved": resolved, "tests": listed, "timed_out": result.timed_out}
        verdict["log_tail"] = log[-2000:]
        return EvalResult(reward=float(resolved), metrics={"resolved": float(resolved)}, info={"swe": verdict})
