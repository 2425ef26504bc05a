"""``harbor``: a Harbor task directory, as published, run by the built-in agent.

The sandbox's working directory is ``/app`` (where Harbor's images put the task's files), seeded
from ``environment/workdir/`` and then the config's ``setup`` (what the Dockerfile's ``RUN``
steps would do; prepared once per node and copied for every sample); its limits come from
``task.toml``'s ``[environment]`` and the episode's wall-clock budget from ``[agent] timeout_sec``.
The agent has bash and an editor and calls ``submit``. EVAL runs ``tests/test.sh`` as Harbor
does: in the agent's environment as it was left, with a fresh copy of ``tests/`` the agent never
saw, and reads ``reward.txt`` or ``reward.json``. A verifier that writes no reward is an
infrastructure failure, never a 0.

With ``image`` set (``build``: environment/Dockerfile built on the node; or a built image's file)
the task runs in its image as Harbor runs it: ``/app`` is the image's, ``tests/`` is copied to
``/tests`` and the reward is read from ``/logs/verifier``, both made fresh just before the
verifier runs (so scripts that hard-code them run unchanged). Without it the host's tools stand
in for the image, and the verifier's directories are fresh unguessable ones under /tmp that
the script finds through ``HARBOR_TESTS_DIR`` / ``HARBOR_VERIFIER_DIR``.
``[environment] allow_internet`` is not honoured: sandboxes never get the host's network.
"""

from __future__ import annotations

import asyncio
import secrets
import shlex
import tempfile
from pathlib import Path
from typing import Any

from farm.agent.handler import AgentHandler, AgentState
from farm.agent.loop import Budgets
from farm.agent.toolbox import system_prompt
from farm.errors import SandboxError, VerifierError
from farm.handlers.base import StageContext
from farm.sandbox.base import Limits, Sandbox, SandboxSpec
from farm.sandbox.prepared import tree_digest
from farm.schemas import EvalResult, TrajectoryData
from tasks.harbor.dataset import HarborConfig
from tasks.harbor.task import HarborTask
from tasks.harbor.verifier import MAX_OUTPUT_BYTES, read_reward, seed_workdir

WORKDIR = "/app"
#: where Harbor puts the tests and reads the reward, in a task's image.
HARBOR_TESTS_DIR = "/tests"
HARBOR_VERIFIER_DIR = "/logs/verifier"
REWARD_FILES = ("reward.txt", "reward.json")
SYSTEM = (
    f"You are an expert at the Linux command line. You work in {WORKDIR}. Complete the task you are given; "
    "when it is done, call submit. Your work is checked by tests you cannot see."
)


class HarborState(AgentState):
    """``AgentState``'s own fields: EVAL runs the verifier in the sandbox the agent left."""


class HarborHandler(AgentHandler[HarborConfig, HarborState]):
    config_class = HarborConfig
    state_class = HarborState
    # test.sh reads the agent's environment as it was left, which is gone once the job is done.
    reverify_safe = False

    def sandbox_spec(self, config: HarborConfig) -> SandboxSpec:
        env = config.resolve().config.environment
        return SandboxSpec(
            image=config.image_ref(), workdir=WORKDIR, limits=Limits(memory_mb=env.memory_mb, cpus=env.cpus)
        )

    def recipe(self, config: HarborConfig, spec: SandboxSpec) -> dict[str, Any]:
        # A task directory given by path may be edited between batches.
        return {**super().recipe(config, spec), "files": tree_digest(config.resolve().environment_dir)}

    def workspace_files(self, config: HarborConfig, dest: Path) -> dict[str, Any]:
        if config.image is None:  # an image brings its own /app
            seed_workdir(config.resolve(), dest)
        return {}

    def budgets(self, config: HarborConfig) -> Budgets:
        # task.toml's agent timeout, unless the spec asks for less.
        limit = config.resolve().config.agent.timeout_sec
        if config.time_limit_s is not None:
            limit = min(limit, config.time_limit_s)
        return Budgets(
            max_turns=config.max_turns,
            max_tokens=config.max_episode_tokens,
            wall_time_s=limit,
            keep_unseen_tail=config.keep_unseen_tail,
        )

    def messages(self, config: HarborConfig, state: HarborState, specs: list[dict[str, Any]]) -> list[dict[str, Any]]:
        return [
            {"role": "system", "content": system_prompt(SYSTEM, specs)},
            {"role": "user", "content": config.resolve().instruction},
        ]

    async def evaluate(
        self, config: HarborConfig, state: HarborState, trajectory: TrajectoryData, ctx: StageContext
    ) -> EvalResult:
        return await asyncio.to_thread(self._verify, config, state, ctx)

    def _verify(self, config: HarborConfig, state: HarborState, ctx: StageContext) -> EvalResult:
        task = config.resolve()
        with self.attached(state, ctx) as sandbox:
            return self._verify_in(task, sandbox, in_image=config.image is not None)

    def _verify_in(self, task: HarborTask, sandbox: Sandbox, *, in_image: bool = False) -> EvalResult:
        if in_image:
            # Harbor's own places, emptied first: whatever the agent left there is gone.
            tests_dir, verifier_dir = HARBOR_TESTS_DIR, HARBOR_VERIFIER_DIR
            cleared = sandbox.run(["rm", "-rf", tests_dir, verifier_dir], timeout_s=60)
            if not cleared.ok:
                raise SandboxError(f"could not clear {tests_dir} and {verifier_dir}: {cleared.output[-500:]!r}")
        else:
            # A fresh, unguessable place: the agent could not have prepared anything there.
            root = f"/tmp/farm-verifier-{secrets.token_hex(8)}"
            tests_dir, verifier_dir = f"{root}/tests", f"{root}/logs/verifier"
        for path in sorted(task.tests_dir.rglob("*")):
            if path.is_file():
                rel = path.relative_to(task.tests_dir).as_posix()
                sandbox.put_file(f"{tests_dir}/{rel}", path.read_bytes(), mode=path.stat().st_mode & 0o777)
        env = {
            **task.config.verifier.env,
            "HARBOR_TESTS_DIR": tests_dir,
            "HARBOR_VERIFIER_DIR": verifier_dir,
        }
        exports = " ".join(f"{k}={shlex.quote(v)}" for k, v in env.items())
        command = f"mkdir -p {verifier_dir} && {exports} bash {tests_dir}/test.sh"
        limit = task.config.verifier.timeout_sec
        result = sandbox.run(["bash", "-c", command], timeout_s=limit, cwd=WORKDIR)
        output = result.output[-MAX_OUTPUT_BYTES:]
        if result.timed_out:
            raise VerifierError(f"the verifier of {task.name} exceeded {limit:g} s", kind="timeout", output=output)
        with tempfile.TemporaryDirectory(prefix="farm-reward-") as tmp:
            for name in REWARD_FILES:
                try:
                    (Path(tmp) / name).write_bytes(sandbox.get_file(f"{verifier_dir}/{name}"))
                except SandboxError:
                    continue
            try:
                reward, metrics, source = read_reward(Path(tmp))
            except VerifierError as exc:
                raise VerifierError(
                    f"{task.name}: {exc.message} (test.sh exited with {result.exit_code}): {output[-500:]!r}",
                    kind=exc.kind,
                    output=output,
                ) from exc
        info = {"task": task.name, "source": source, "exit_code": result.exit_code, "output": output[-4000:]}
        return EvalResult(reward=reward, metrics=metrics, info={"harbor": info})
