"""The base of the shipped agent handlers: a sandbox made at INIT, an episode at RUN, cleanup at the end.

A subclass says what its task looks like and how it is scored; this class does the rest:

- ``sandbox_spec`` (None: no sandbox) and ``workspace_files`` (the task's starting files,
  copied into the sandbox's private workspace) make the sandbox at INIT on this node; ``setup``
  (a bash script, from the config's ``setup``) then runs once in a sandbox of its own, before any
  agent: dependencies, a build. What the files and the setup make is prepared once per node and
  every sample of the task starts from a private copy of it (``farm.sandbox.prepared``);
  ``pristine`` gives EVAL that same untouched copy to score against;
- ``messages`` and ``tool_names`` set up the episode; ``budgets`` bounds it;
- ``collect`` takes what EVAL needs out of the sandbox at the end of RUN (a diff, a file),
  so EVAL can score on a fresh copy instead of on the agent's workspace;
- ``evaluate`` (from :class:`TaskHandler`) scores it.

A retried RUN never continues a half-done episode: it closes the sandbox and starts over in a
new one made the same way INIT made the first. ``teardown`` closes the sandbox and releases
the job's backend slot, whichever way the job ended.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator
from contextlib import AbstractContextManager, contextmanager
from pathlib import Path
from typing import Any, ClassVar

from typing_extensions import TypeVar

from farm.agent.loop import Budgets, Episode, run_episode
from farm.agent.record import ACTIONS_KEY
from farm.agent.toolbox import SandboxToolbox, ToolSpecs
from farm.errors import SandboxError, TaskSetupFailed
from farm.handlers.base import ConfigT, HandlerState, StageContext, TaskHandler
from farm.llm.rendering import ChatRenderer
from farm.llm.trajectory import TokenSegment, TrajectoryBuilder
from farm.sandbox.base import Sandbox, SandboxSpec
from farm.sandbox.prepared import Prepared, copy_out
from farm.sandbox.registry import remove_tree
from farm.schemas import RunResult, SegmentData, TrajectoryData
from farm.tools.base import ToolResult

#: state key of the job's sandbox id.
SANDBOX_KEY = "sandbox"
#: state key naming the prepared workspace the sample started from, and whether it built it.
PREPARED_KEY = "prepared"
#: how long a task's setup may run when its config does not say.
DEFAULT_SETUP_TIMEOUT_S = 600.0
#: the end of the final reply kept in the job's state for EVAL (the trajectory holds all of it).
MAX_FINAL_TEXT_CHARS = 20_000


class AgentState(HandlerState):
    """What an agent task keeps between its stages; a task's own state adds what its
    ``workspace_files`` and ``collect`` return."""

    #: the job's sandbox on its node (none for a task without one).
    sandbox: str | None = None
    #: the prepared workspace the sample started from, and whether it built it.
    prepared: dict[str, Any] | None = None
    #: the end of the final reply (the trajectory holds all of it).
    final_text: str = ""
    #: the arguments of the ``submit`` call, when there was one.
    submitted: dict[str, Any] | None = None
    #: the episode's tool calls, for ``farm replay`` (see ``farm.agent.record``).
    actions: list[dict[str, Any]] | None = None


AgentStateT = TypeVar("AgentStateT", bound=AgentState, default=AgentState)


class AgentHandler(TaskHandler[ConfigT, AgentStateT]):
    """See the module docstring. Subclasses set ``config_class`` and ``state_class`` and override
    the hooks they need."""

    state_class: ClassVar[type[HandlerState]] = AgentState

    #: a reply without a tool call ends the episode as the answer (math, code).
    answer_in_text: ClassVar[bool] = False

    # ---- hooks ------------------------------------------------------------------------------
    def sandbox_spec(self, config: ConfigT) -> SandboxSpec | None:
        """The sandbox the task runs in; None for a task without one."""
        return SandboxSpec()

    def workspace_files(self, config: ConfigT, dest: Path) -> dict[str, Any]:
        """Write the task's starting files into ``dest``; returns state for the later stages."""
        return {}

    def setup(self, config: ConfigT) -> str | None:
        """Bash run once in the workspace after ``workspace_files``, before any agent starts; the
        config's ``setup`` where it has one."""
        script = getattr(config, "setup", None)
        return script if isinstance(script, str) and script.strip() else None

    def setup_timeout_s(self, config: ConfigT) -> float:
        return float(getattr(config, "setup_timeout_s", None) or DEFAULT_SETUP_TIMEOUT_S)

    def after_setup(self, config: ConfigT, state: dict[str, Any], sandbox: Sandbox) -> None:
        """Runs in the setup's sandbox once ``setup`` succeeded (blocking): check or tidy what it made.

        Raises:
            TaskSetupFailed: the setup left something the task cannot start from.
        """

    def recipe(self, config: ConfigT, spec: SandboxSpec) -> dict[str, Any]:
        """JSON naming everything that decides the prepared workspace (samples with equal recipes
        share one): the handler, the task config and the sandbox spec."""
        return {
            "handler": f"{type(self).__module__}.{type(self).__qualname__}",
            "config": config.model_dump(mode="json"),
            "spec": spec.model_dump(mode="json", exclude={"label"}),
        }

    def tool_names(self, config: ConfigT) -> list[str]:
        return ["bash", "editor"]

    def messages(self, config: ConfigT, state: AgentStateT, specs: list[dict[str, Any]]) -> list[dict[str, Any]]:
        """The first messages (system with ``specs`` described, then the task). ``specs`` is a
        ``ToolSpecs``: ``farm.agent.toolbox.system_prompt`` leaves the tools to a chat template that
        describes them itself."""
        raise NotImplementedError(f"{type(self).__name__} must give the first messages of its task")

    def budgets(self, config: ConfigT) -> Budgets:
        """From the config's ``max_turns``, ``max_episode_tokens``, ``time_limit_s`` and
        ``keep_unseen_tail`` where it has them."""
        return Budgets(
            max_turns=int(getattr(config, "max_turns", Budgets.max_turns)),
            max_tokens=getattr(config, "max_episode_tokens", None),
            wall_time_s=getattr(config, "time_limit_s", None),
            keep_unseen_tail=bool(getattr(config, "keep_unseen_tail", False)),
        )

    def collect(self, config: ConfigT, state: AgentStateT, sandbox: Sandbox | None, episode: Episode) -> dict[str, Any]:
        """What EVAL needs from the sandbox, taken at the end of RUN (blocking; runs in a thread): keys
        of the task's state."""
        return {}

    # ---- stages -----------------------------------------------------------------------------
    async def init(self, config: ConfigT, ctx: StageContext) -> AgentStateT:
        spec = self.sandbox_spec(config)
        if spec is None:
            return self.load_state({})
        _, made = await asyncio.to_thread(self._new_sandbox, config, spec, ctx)
        return self.load_state(made)

    def _new_sandbox(self, config: ConfigT, spec: SandboxSpec, ctx: StageContext) -> tuple[Sandbox, dict[str, Any]]:
        """A sandbox on a private copy of the prepared workspace (built now if this node has none)."""
        with self._prepared(config, spec, ctx) as prepared:
            update = {"workspace": prepared.workspace, "label": f"job {ctx.job_id}"}
            sandbox = ctx.sandboxes.create(spec.model_copy(update=update))
        # The keys of the task's state: what workspace_files returned, the sandbox, the workspace.
        return sandbox, {**prepared.state, SANDBOX_KEY: sandbox.id, PREPARED_KEY: prepared.describe()}

    def _prepared(self, config: ConfigT, spec: SandboxSpec, ctx: StageContext) -> AbstractContextManager[Prepared]:
        return ctx.sandboxes.prepared(self.recipe(config, spec), lambda dest: self._prepare(config, spec, ctx, dest))

    def _prepare(self, config: ConfigT, spec: SandboxSpec, ctx: StageContext, dest: Path) -> dict[str, Any]:
        """Fill the empty ``dest`` with the task's files, then run its setup over them."""
        state = self.workspace_files(config, dest)
        script = self.setup(config)
        if script is None:
            return state
        limit = self.setup_timeout_s(config)
        setup_spec = spec.model_copy(update={"workspace": dest, "label": f"job {ctx.job_id} setup"})
        with ctx.sandboxes.create(setup_spec) as sandbox:
            result = sandbox.run(["bash", "-c", script], timeout_s=limit, cwd=sandbox.workdir)
            tail = result.output[-2000:]
            if result.timed_out:
                raise TaskSetupFailed(f"the task's setup ran past setup_timeout_s ({limit:g} s): {tail!r}")
            if not result.ok:
                raise TaskSetupFailed(f"the task's setup exited with {result.exit_code}: {tail!r}")
            self.after_setup(config, state, sandbox)
            # What the setup made is the starting point: the sandbox's workspace replaces the files.
            remove_tree(dest)
            copy_out(sandbox.host_workspace, dest)
        return state

    @contextmanager
    def pristine(self, config: ConfigT, ctx: StageContext) -> Iterator[Path]:
        """The prepared workspace every sample started from, untouched by any agent (blocking):
        what EVAL scores a diff or a solution against. Built again if this node no longer has it."""
        spec = self.sandbox_spec(config)
        if spec is None:
            raise TypeError(f"{type(self).__name__} has no sandbox, so no prepared workspace")
        with self._prepared(config, spec, ctx) as prepared:
            yield prepared.workspace

    async def run(self, config: ConfigT, state: AgentStateT, ctx: StageContext) -> RunResult:
        started = time.monotonic()
        spec = self.sandbox_spec(config)
        sandbox: Sandbox | None = None
        fresh: dict[str, Any] = {}
        if spec is not None:
            sandboxes = ctx.sandboxes
            if ctx.attempt <= 1:
                sandbox = await asyncio.to_thread(sandboxes.attach, _sandbox_id(state))
            else:
                # The failed attempt may have left the workspace half-edited: start over.
                await asyncio.to_thread(sandboxes.destroy, _sandbox_id(state))
                sandbox, fresh = await asyncio.to_thread(self._new_sandbox, config, spec, ctx)
        try:
            return await self._episode(config, state.updated(fresh), sandbox, ctx, fresh, started)
        except BaseException:
            if fresh and sandbox is not None:  # teardown only knows the sandbox INIT made
                await asyncio.to_thread(sandbox.close)
            raise
        finally:
            if sandbox is not None:
                sandbox.detach()

    async def _episode(
        self,
        config: ConfigT,
        state: AgentStateT,
        sandbox: Sandbox | None,
        ctx: StageContext,
        fresh: dict[str, Any],
        started: float,
    ) -> RunResult:
        llm = ctx.llm
        tools = SandboxToolbox(sandbox.tools(), self.tool_names(config)) if sandbox is not None else None
        raw = [dict(spec) for spec in tools.specs] if tools is not None else []
        tokenizer = await asyncio.to_thread(lambda: llm.tokenizer)
        parsers = await asyncio.to_thread(lambda: llm.parsers)
        # A family's template writes the tools and how to call them: the system prompt need not.
        described = bool(raw) and await asyncio.to_thread(ChatRenderer(tokenizer).renders_tools)
        specs = ToolSpecs(raw, described_by_template=described, call_format=parsers.tool_calls)
        messages = self.messages(config, state, specs)
        builder = await asyncio.to_thread(
            lambda: TrajectoryBuilder(
                tokenizer=tokenizer,
                messages=messages,
                tools=[{"type": "function", "function": spec} for spec in raw] or None,
                history=ctx.history,
                # The family's template kwargs (DeepSeek-R1: thinking on), as ``llm.parsers`` reads the replies.
                chat_template_kwargs=dict(parsers.template_kwargs) or None,
            )
        )
        setup_s = time.monotonic() - started
        async with llm.session(ctx.job_id) as session:
            episode = await run_episode(
                llm=session,
                builder=builder,
                tools=tools,
                sampling=ctx.sampling.model_copy(update={"seed": ctx.seed}),
                budgets=self.budgets(config),
                deadline=ctx.deadline,
                is_cancelled=ctx.is_cancelled,
                answer_in_text=self.answer_in_text,
                parsers=parsers,
            )
            held = {"aborted_turns": session.aborted_turns, "paused_s": round(session.paused_s, 3)}
        collect_started = time.monotonic()
        collected = await asyncio.to_thread(self.collect, config, state, sandbox, episode)
        # Time spent outside the episode proper: attaching, the first prompt, taking the result out.
        episode.timings["setup_s"] = round(setup_s, 6)
        episode.timings["collect_s"] = round(time.monotonic() - collect_started, 6)
        # The segment with the last model turn is the trajectory's arrays; the others (a template
        # that rewrote the history under ``template``) go with it, so no sampled id is lost.
        main, others = episode.trajectory.segments()
        trajectory = TrajectoryData(
            **_arrays(main),
            segments=[SegmentData(**_arrays(segment)) for segment in others],
            # What weight updates cost this episode: turns re-issued after an abort, time held; and
            # which prepared workspace it started from.
            info={
                **episode.info(),
                **{k: v for k, v in held.items() if v},
                **({PREPARED_KEY: state.prepared} if state.prepared is not None else {}),
            },
        )
        out_state = {
            **fresh,
            **collected,
            "final_text": episode.final_text[-MAX_FINAL_TEXT_CHARS:],
            "submitted": episode.submitted,
            ACTIONS_KEY: episode.actions.steps,
        }
        return RunResult(trajectory=trajectory, outcome=episode.outcome, reason=episode.reason, state=out_state)

    @contextmanager
    def attached(self, state: AgentStateT, ctx: StageContext) -> Iterator[Sandbox]:
        """The job's sandbox, for an EVAL that scores the agent's environment as it was left."""
        sandbox = ctx.sandboxes.attach(_sandbox_id(state))
        try:
            yield sandbox
        finally:
            sandbox.detach()

    async def teardown(self, config: ConfigT, state: AgentStateT, ctx: StageContext) -> None:
        await asyncio.to_thread(self._release, state, ctx)

    @staticmethod
    def _release(state: AgentState, ctx: StageContext) -> None:
        if state.sandbox is not None:
            ctx.sandboxes.destroy(state.sandbox)
        ctx.llm.release(ctx.job_id)

    @staticmethod
    def run_fresh(
        ctx: StageContext, workspace: Path, command: str, *, timeout_s: float, outputs: list[str]
    ) -> tuple[ToolResult, dict[str, bytes]]:
        """Run ``command`` (bash) in a new sandbox started from ``workspace``; return it and ``outputs``.

        For scoring on a fresh copy: nothing the agent left running or wrote can reach it.
        ``outputs`` are workspace-relative files read back afterwards (a missing one is left out).
        """
        spec = SandboxSpec(workspace=workspace, label=f"job {ctx.job_id} eval")
        with ctx.sandboxes.create(spec) as sandbox:
            result = sandbox.run(["bash", "-c", command], timeout_s=timeout_s)
            files: dict[str, bytes] = {}
            for name in outputs:
                try:
                    files[name] = sandbox.get_file(name)
                except SandboxError:
                    continue
        return result, files

    @staticmethod
    def answer_text(state: AgentState) -> str:
        """The agent's answer: ``submit``'s ``answer`` argument, else its last reply."""
        answer = (state.submitted or {}).get("answer")
        return answer if isinstance(answer, str) and answer.strip() else state.final_text


def _arrays(segment: TokenSegment) -> dict[str, Any]:
    return {
        "token_ids": segment.token_ids,
        "logprobs": segment.logprobs,
        "loss_mask": segment.loss_mask,
        "turn_offsets": [span.start for span in segment.turns],
        "weight_versions": segment.weight_versions,
    }


def _sandbox_id(state: AgentState) -> str:
    if state.sandbox is None:  # INIT made none: a handler bug, as a missing key of the dict state was
        raise KeyError(SANDBOX_KEY)
    return state.sandbox
