"""``harness``: a swe or harbor task, run by an unmodified external harness through the proxy.

- INIT makes the inner task's sandbox as that task does, with two additions: the node's proxy
  socket offered inside it on a loopback port (the sandbox still has no network), and the harness's
  environment (a venv or an npm tree, built once per node) mounted read-only.
- RUN opens a trial, starts the harness in the sandbox with the trial's base URLs and key, waits for
  it (the task's time limit), ends the trial and reads its record. The trial's history policy is
  the config's ``harness.history`` where it is set, else the batch's (``StageContext.history``).
  The job's trajectory is the record's *main segment*, the one holding the trial's last answered
  call (the harness's final conversation), with every other segment of the record in its
  ``segments``, oldest first; ``info`` names the trial and its segments. A harness that exits
  non-zero or times out is the policy's doing (``agent_error`` / ``agent_timeout``): it is scored
  like any other episode. A record that is
  incomplete is not trainable: the job ends ``infra_error``.
- EVAL is the inner task's grader, on what the harness left in the sandbox.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

from farm.agent.handler import AgentState
from farm.constants import Outcome
from farm.errors import InvalidSpec, SandboxError
from farm.handlers.base import OpenTrial, StageContext, TaskHandler
from farm.handlers.registry import get_handler
from farm.llm.trajectory import TokenTrajectory
from farm.sandbox.base import Bind, Forward
from farm.schemas import EvalResult, RunResult, SegmentData, TrajectoryData, TrialRecordData
from tasks.harness import presets
from tasks.harness.config import HarnessConfig

#: the loopback port the proxy is offered on inside the sandbox.
PROXY_PORT = 18080
#: PATH for the harness: its environment's executables first.
DEFAULT_PATH = "/usr/local/bin:/usr/bin:/bin"
HARNESS_PATH_KEY = "harness_path"
#: the harness's output kept in the trajectory's info.
MAX_OUTPUT_CHARS = 8000


class HarnessState(AgentState):
    """The inner task's state (its own keys kept as they are) and the PATH the harness runs with."""

    harness_path: str = DEFAULT_PATH


class HarnessHandler(TaskHandler[HarnessConfig, HarnessState]):
    config_class = HarnessConfig
    state_class = HarnessState

    def can_reverify(self, config: HarnessConfig) -> bool:
        # The inner task's grader scores what collect() took out of the sandbox (a swe diff), or the sandbox itself.
        inner, inner_config = self._inner(config)
        return bool(inner.can_reverify(inner_config))

    def _inner(self, config: HarnessConfig) -> tuple[Any, Any]:
        inner = get_handler(config.task.type)
        return inner, inner.validate(config.task.config)

    async def init(self, config: HarnessConfig, ctx: StageContext) -> HarnessState:
        return self.load_state(await self._new_sandbox(config, ctx))

    async def _new_sandbox(self, config: HarnessConfig, ctx: StageContext) -> dict[str, Any]:
        """The inner task's sandbox, with the proxy offered inside it and the harness's environment bound in."""
        inner, inner_config = self._inner(config)
        socket = ctx.trials.socket
        if socket is None:
            raise SandboxError("this node has no proxy socket: start `farm proxy --socket PATH` and set proxy.socket")
        spec = inner.sandbox_spec(inner_config)
        if spec is None:
            raise InvalidSpec(f"task type {config.task.type!r} has no sandbox to run a harness in", field="config.task")
        environment = presets.ENVIRONMENTS.get(config.harness.preset)
        binds, path = list(spec.binds), DEFAULT_PATH
        if environment is not None:
            built = await asyncio.to_thread(ctx.sandboxes.environment, environment.kind, environment.packages)
            binds.append(Bind(source=built))  # at its own path: a venv's scripts name it absolutely
            path = f"{built / ('bin' if environment.kind == 'venv' else 'node_modules/.bin')}:{path}"
        spec = spec.model_copy(update={"binds": binds, "forwards": [Forward(socket=socket, port=PROXY_PORT)]})
        _, state = await asyncio.to_thread(inner._new_sandbox, inner_config, spec, ctx)
        return {**state, HARNESS_PATH_KEY: path}

    async def run(self, config: HarnessConfig, state: HarnessState, ctx: StageContext) -> RunResult:
        inner, inner_config = self._inner(config)
        if ctx.attempt > 1:  # the failed attempt's harness may have left the workspace half-edited
            await asyncio.to_thread(ctx.sandboxes.destroy, _sandbox_id(state))
            state = state.updated(await self._new_sandbox(config, ctx))
        sandbox_id = _sandbox_id(state)
        inner_state = inner.load_state(state.stored())
        sandbox = await asyncio.to_thread(ctx.sandboxes.attach, sandbox_id)
        # The trial overrides only what the trainer set (a default max_tokens would override the
        # harness's own); a seed it set becomes this job's seed.
        sampling = ctx.sampling.model_dump(exclude_unset=True)
        if sampling.get("seed") is not None:
            sampling["seed"] = ctx.seed
        trial = await asyncio.to_thread(
            ctx.trials.open,
            job_id=ctx.job_id,
            attempt=ctx.attempt,
            sampling=sampling,
            history=config.harness.history or ctx.history,
        )
        try:
            instruction = inner.messages(inner_config, inner_state, [])[-1]["content"]
            launch = presets.launch(config.harness, _endpoint(trial), instruction=instruction, workdir=sandbox.workdir)
            launch.env["PATH"] = state.harness_path
            for path, text in launch.files.items():
                await asyncio.to_thread(sandbox.put_file, path, text.encode())
            limit = min(x for x in (config.harness.time_limit_s, ctx.remaining_s(), _task_limit(inner_config)) if x)
            started = time.monotonic()
            watcher = asyncio.create_task(_stop_when_cancelled(ctx, sandbox_id))
            try:
                result = await asyncio.to_thread(
                    sandbox.run, launch.argv, timeout_s=limit, cwd=sandbox.workdir, env=launch.env
                )
            except SandboxError:
                if not ctx.is_cancelled():
                    raise
                await asyncio.to_thread(ctx.trials.close, trial.id)
                return _cancelled(state)
            finally:
                watcher.cancel()
            elapsed = time.monotonic() - started
            record = await asyncio.to_thread(ctx.trials.close, trial.id)
            if ctx.is_cancelled():
                return _cancelled(state)
            collected = await asyncio.to_thread(inner.collect, inner_config, inner_state, sandbox, _episode())
        finally:
            sandbox.detach()
        outcome, reason = Outcome.OK, None
        if result.timed_out:
            outcome, reason = Outcome.AGENT_TIMEOUT, f"the harness ran past {limit:g} s"
        elif result.exit_code not in (0, None):
            outcome, reason = Outcome.AGENT_ERROR, f"the harness exited with {result.exit_code}"
        if record.incomplete is not None:
            outcome, reason = Outcome.INFRA_ERROR, f"the trial's record is incomplete: {record.incomplete}"
        info = {
            "harness": config.harness.preset,
            "trial": trial.id,
            "segments": len(record.segments),
            "main_segment": record.main,
            "calls": len(record.certificate),
            "exit_code": result.exit_code,
            "harness_s": round(elapsed, 3),
            "output": result.output[-MAX_OUTPUT_CHARS:],
        }
        return RunResult(
            trajectory=_main(record, info), outcome=outcome, reason=reason, state={**state.stored(), **collected}
        )

    async def evaluate(
        self, config: HarnessConfig, state: HarnessState, trajectory: TrajectoryData, ctx: StageContext
    ) -> EvalResult:
        inner, inner_config = self._inner(config)
        result: EvalResult = await inner.evaluate(inner_config, inner.load_state(state.stored()), trajectory, ctx)
        return result

    async def teardown(self, config: HarnessConfig, state: HarnessState, ctx: StageContext) -> None:
        inner, inner_config = self._inner(config)
        await inner.teardown(inner_config, inner.load_state(state.stored()), ctx)


#: how often a running harness's job looks at its cancel flag.
CANCEL_POLL_S = 0.25


async def _stop_when_cancelled(ctx: StageContext, sandbox_id: str) -> None:
    """When the job is cancelled (a batch cancel, a dynamic batch's target reached), the sandbox goes
    and the harness with it: its connections to the proxy close, which closes the model request it
    was waiting on (the backend aborts it), and the trial's backend slot is released at its end."""
    while not ctx.is_cancelled():
        await asyncio.sleep(CANCEL_POLL_S)
    await asyncio.to_thread(ctx.sandboxes.destroy, sandbox_id)


def _cancelled(state: HarnessState) -> RunResult:
    empty = TrajectoryData(token_ids=[], logprobs=[], loss_mask=[])
    return RunResult(trajectory=empty, outcome=Outcome.CANCELLED, reason="the job was cancelled", state=state.stored())


def _sandbox_id(state: HarnessState) -> str:
    if state.sandbox is None:  # INIT made none: a handler bug, as a missing key of the dict state was
        raise KeyError("sandbox")
    return state.sandbox


def _endpoint(trial: OpenTrial) -> presets.Endpoint:
    base = f"http://127.0.0.1:{PROXY_PORT}/proxy/{trial.id}"
    return presets.Endpoint(openai_base_url=f"{base}/v1", anthropic_base_url=base, api_key=trial.key, model=trial.model)


def _task_limit(inner_config: Any) -> float | None:
    value = getattr(inner_config, "time_limit_s", None)
    return float(value) if value else None


def _episode() -> Any:
    # The inner task's collect() takes the built-in agent's Episode; a harness has none of its facts.
    from farm.agent.loop import Episode

    return Episode(outcome=Outcome.OK, reason=None, trajectory=TokenTrajectory())


def _main(record: TrialRecordData, info: dict[str, Any]) -> TrajectoryData:
    """The record's main segment, with the others (in the record's order) in its ``segments``."""
    if record.main is None:  # the harness never got an answer: an empty episode
        return TrajectoryData(token_ids=[], logprobs=[], loss_mask=[], info=info)
    main = record.segments[record.main]
    # Already validated (the record's trajectories): constructed, not validated again.
    others = [
        SegmentData.model_construct(**{name: getattr(segment, name) for name in SegmentData.model_fields})
        for i, segment in enumerate(record.segments)
        if i != record.main
    ]
    return main.model_copy(update={"info": {**main.info, **info}, "segments": others})
