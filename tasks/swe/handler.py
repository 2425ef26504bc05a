"""``swe``: fix a bug in a small repository; FAIL_TO_PASS and PASS_TO_PASS decide the reward.

INIT commits the pre-fix files into the sandbox's workspace (the base commit), after the
config's ``setup`` (dependencies, a build) ran over them once per node; what the setup made is
listed in ``.git/info/exclude``, so it is never part of the agent's diff. The agent
edits with bash and the editor and calls ``submit``. At the end of RUN its diff against the
base commit is taken inside the sandbox (new files included; git never runs on the host
against a repository the agent controlled). EVAL applies that diff to a fresh copy of the
base commit (the prepared workspace the agent started from, setup products included), puts
every test and pytest configuration file back, applies the hidden ``test_patch`` and runs the
tests in a new sandbox: nothing but the diff reaches it.
"""

from __future__ import annotations

import asyncio
import shlex
from pathlib import Path
from typing import Any

from farm.agent.handler import AgentHandler, AgentState
from farm.agent.loop import Episode
from farm.agent.toolbox import system_prompt
from farm.errors import SandboxError, TaskSetupFailed
from farm.handlers.base import StageContext
from farm.sandbox.base import Sandbox, SandboxSpec
from farm.sandbox.prepared import tree_digest
from farm.schemas import EvalResult, TrajectoryData
from tasks.swe.dataset import SweConfig
from tasks.swe.evaluate import TEST_ENV, SweResult, materialise, prepare_repo, score, test_argv

PATCH_FILE = "/tmp/.farm-agent.patch"
PYTEST_OUT = "/tmp/.farm-pytest.out"
_GIT = "git -c safe.directory='*' -c core.hooksPath=/dev/null -c core.fsmonitor=false"
SYSTEM = (
    "You are a software engineer fixing an issue in the repository in /workspace (a git checkout). "
    "Find the cause, edit the source, and check your fix with `python -m pytest`. Do not edit the tests: "
    "hidden tests decide whether the issue is resolved. When the fix is done, call submit."
)


def diff_command(base_commit: str) -> str:
    """Bash that writes every change since ``base_commit`` (untracked files too) to PATCH_FILE.

    A throwaway index leaves the agent's own staging area alone.
    """
    base = shlex.quote(base_commit)
    return (
        f"export GIT_INDEX_FILE=/tmp/.farm-index GIT_CONFIG_GLOBAL=/dev/null GIT_CONFIG_NOSYSTEM=1 && "
        f"{_GIT} read-tree {base} && {_GIT} add -A && {_GIT} diff --cached --binary {base} > {PATCH_FILE}"
    )


def exclude_setup_products_command(base_commit: str) -> str:
    """Bash that refuses a setup which committed or changed the base commit's files (the agent's
    diff would carry that), then lists every untracked file it made in ``.git/info/exclude``."""
    base = shlex.quote(base_commit)
    escape = r"sed -e 's/[][*?!#\\]/\\&/g' -e 's|^|/|'"
    return (
        f'g() {{ {_GIT} -c core.quotePath=false "$@"; }}; '
        f'test "$(g rev-parse HEAD)" = {base} || {{ echo "the setup made a commit"; exit 3; }}; '
        f'changed=$(g status --porcelain --untracked-files=no) && test -z "$changed" '
        f'|| {{ echo "the setup changed files of the base commit: $changed"; exit 4; }}; '
        f"mkdir -p .git/info && g ls-files --others --exclude-standard --directory | {escape} >> .git/info/exclude"
    )


class SweState(AgentState):
    """The base commit the workspace starts from (INIT), and the agent's diff from it (RUN)."""

    base_commit: str = ""
    #: None: no diff could be taken (``patch_error`` says why).
    patch: str | None = None
    patch_error: str | None = None


class SweHandler(AgentHandler[SweConfig, SweState]):
    config_class = SweConfig
    state_class = SweState
    # The diff is taken at the end of RUN and kept in the job's state; EVAL applies it to a fresh copy.
    reverify_safe = True

    def workspace_files(self, config: SweConfig, dest: Path) -> dict[str, Any]:
        return {"base_commit": materialise(config.resolve(), dest)}

    def recipe(self, config: SweConfig, spec: SandboxSpec) -> dict[str, Any]:
        return {**super().recipe(config, spec), "files": tree_digest(config.resolve().repo_dir)}

    def after_setup(self, config: SweConfig, state: dict[str, Any], sandbox: Sandbox) -> None:
        result = sandbox.run(["bash", "-c", exclude_setup_products_command(state["base_commit"])], timeout_s=120)
        if not result.ok:
            raise TaskSetupFailed(f"{config.instance_id}: {result.output[-1000:].strip() or result.error}")

    def messages(self, config: SweConfig, state: SweState, specs: list[dict[str, Any]]) -> list[dict[str, Any]]:
        return [
            {"role": "system", "content": system_prompt(SYSTEM, specs)},
            {"role": "user", "content": config.resolve().instruction()},
        ]

    def collect(self, config: SweConfig, state: SweState, sandbox: Sandbox | None, episode: Episode) -> dict[str, Any]:
        assert sandbox is not None
        result = sandbox.run(["bash", "-c", diff_command(state.base_commit)], timeout_s=120)
        if not result.ok:
            # The agent broke its own checkout (removed .git, say): no diff, scored as such.
            return {"patch": None, "patch_error": result.output[-1000:] or str(result.error)}
        return {"patch": sandbox.get_file(PATCH_FILE).decode("utf-8", errors="replace")}

    async def evaluate(
        self, config: SweConfig, state: SweState, trajectory: TrajectoryData, ctx: StageContext
    ) -> EvalResult:
        return await asyncio.to_thread(self._grade, config, state, ctx)

    def _grade(self, config: SweConfig, state: SweState, ctx: StageContext) -> EvalResult:
        instance = config.resolve()
        patch = state.patch
        if patch is None:
            why = f"no diff could be taken from the agent's checkout: {state.patch_error or ''}"
            return EvalResult(reward=0.0, metrics={"resolved": 0.0}, info={"swe": {"reason": why}})
        with ctx.sandboxes.scratch_dir(prefix=f"job{ctx.job_id}-eval-") as scratch:
            with self.pristine(config, ctx) as pristine:
                prepared = prepare_repo(instance, patch, scratch_dir=scratch, pristine=pristine)
            if isinstance(prepared, SweResult):
                return self._result(prepared, patch)
            env = " ".join(f"{k}={shlex.quote(v)}" for k, v in TEST_ENV.items())
            command = f"{env} {shlex.join(test_argv(instance, 'python'))} > {PYTEST_OUT} 2>&1"
            result, files = self.run_fresh(
                ctx, prepared.repo, command, timeout_s=config.test_timeout_s, outputs=[PYTEST_OUT]
            )
        if result.exit_code in (126, 127) or PYTEST_OUT not in files:
            raise SandboxError(f"the tests could not run: {result.output[-500:]!r}", job_id=ctx.job_id)
        output = files[PYTEST_OUT].decode("utf-8", errors="replace")
        graded = score(
            instance, prepared, stdout=output, stderr="", timed_out=result.timed_out, timeout_s=config.test_timeout_s
        )
        return self._result(graded, patch)

    @staticmethod
    def _result(graded: SweResult, patch: str) -> EvalResult:
        info = {**graded.info(), "patch_bytes": len(patch.encode("utf-8", errors="replace"))}
        return EvalResult(reward=graded.reward, metrics={"resolved": float(graded.resolved)}, info={"swe": info})
