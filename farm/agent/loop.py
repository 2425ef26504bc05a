"""The built-in agent loop: sample a turn, run its tool calls, append the observations, repeat.

One episode, token in and token out::

    episode = await run_episode(llm=session, builder=builder, tools=toolbox, sampling=sampling,
                                budgets=Budgets(max_turns=30), deadline=ctx.deadline)

The prompt the backend sees is always ``builder.prompt_ids``: the sampled ids of every turn
stay exactly as the backend returned them and observations are appended as the chat
template's text for them, under the batch's history policy (:mod:`farm.llm.trajectory`), so
what is stored is what was sampled. Each turn is read with the served model's parsers
(:mod:`farm.agent.turns`): its reasoning, its answer and its tool calls in the family's format.

How an episode ends is data, never an exception, as long as the policy is responsible:

- ``ok``: the agent called ``submit`` (or, where the task takes a plain answer, replied
  without a tool call);
- ``agent_error``: the turn or token budget ran out before it finished;
- ``agent_timeout``: the wall-clock budget ran out (a model call or a tool call in flight is
  cut off);
- ``context_overflow``: the conversation no longer fits the context window;
- ``cancelled``: the batch was cancelled (checked before every turn).

Infrastructure failures raise: an unreachable backend (``UpstreamError``), a dead sandbox
(``SandboxError``); the pipeline retries the stage and reports them as such, never as a reward.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from farm.agent.record import ActionLog
from farm.agent.toolcalls import ToolCall
from farm.agent.turns import SUBMIT, TurnReader, no_call_hint
from farm.constants import Outcome
from farm.errors import Cancelled, ContextLengthExceeded, TemplateRefused, UpstreamStatusError
from farm.llm.session import until_cancelled
from farm.llm.trajectory import TokenTrajectory, TrajectoryBuilder
from farm.llm.types import FinishReason, GenerateResult, SamplingParams
from farm.proxy.parsers import ParserNames
from farm.proxy.reasoning_formats import PROMPT_TAIL_IDS
from farm.tools.base import ToolResult

#: the tool that ends an episode (``SUBMIT``); the shipped handlers all add it.
SUBMIT_SPEC: dict[str, Any] = {
    "name": SUBMIT,
    "description": "Call this once the task is done. Your work is graded as it stands when you call it.",
    "parameters": {
        "type": "object",
        "properties": {"answer": {"type": "string", "description": "your final answer, if the task asks for one"}},
        "required": [],
    },
}
#: what the agent is told when a turn has neither a tool call nor an answer the task accepts (hermes;
#: another format's hint shows that format: ``farm.agent.turns.no_call_hint``).
NO_CALL_HINT = no_call_hint("hermes")
#: an observation longer than this many characters is cut in the middle (tools cap their own output too).
MAX_OBSERVATION_CHARS = 16_000


class Toolbox(Protocol):
    """The tools of one episode. ``call`` runs in a worker thread; a failing tool returns data."""

    @property
    def specs(self) -> Sequence[Mapping[str, Any]]: ...

    def call(self, name: str, arguments: dict[str, Any], *, timeout_s: float | None) -> ToolResult: ...


class LLM(Protocol):
    """What the loop needs of an LLM session (:class:`farm.llm.session.LLMSession`)."""

    moves: list[tuple[str, str]]
    backend_id: str | None

    async def generate(self, prompt_ids: list[int], sampling: SamplingParams | None = None) -> GenerateResult: ...


@dataclass(frozen=True)
class Budgets:
    """Limits of one episode; ``None`` means no limit of that kind."""

    max_turns: int = 30
    #: sampled tokens over the whole episode.
    max_tokens: int | None = None
    #: prompt plus reply, the model's context window (backends also refuse past it).
    max_context_tokens: int | None = None
    wall_time_s: float | None = None
    #: keep what follows the last model turn (an observation and a generation prompt the model never
    #: saw, when the episode ran out of turns, time or context). Off: a trainer gets only the tokens
    #: the model saw or sampled, which also keeps the trajectory within the backend's context.
    keep_unseen_tail: bool = False


@dataclass
class Episode:
    """What one episode did. ``timings`` splits its wall time into model, tools and the rest."""

    outcome: Outcome
    reason: str | None
    trajectory: TokenTrajectory
    turns: int = 0
    sampled_tokens: int = 0
    #: the arguments of the ``submit`` call, when there was one.
    submitted: dict[str, Any] | None = None
    #: the last assistant message's text.
    final_text: str = ""
    tool_calls: int = 0
    #: malformed calls (bad JSON, unknown tool, bad arguments) answered with an error observation.
    bad_calls: int = 0
    finish_reasons: list[str] = field(default_factory=list)
    timings: dict[str, float] = field(default_factory=dict)
    moves: list[tuple[str, str]] = field(default_factory=list)
    backend: str | None = None
    #: tokens after the last model turn left out of the trajectory (see ``Budgets.keep_unseen_tail``).
    unseen_tail_tokens: int = 0
    #: every tool call run and what it answered, for ``farm replay`` (:mod:`farm.agent.record`).
    actions: ActionLog = field(default_factory=ActionLog)

    def info(self) -> dict[str, Any]:
        """JSON-ready summary for ``TrajectoryData.info``."""
        return {
            "turns": self.turns,
            "sampled_tokens": self.sampled_tokens,
            "tool_calls": self.tool_calls,
            "bad_calls": self.bad_calls,
            "submitted": self.submitted is not None,
            "finish_reasons": self.finish_reasons,
            "timings": self.timings,
            "moves": [list(move) for move in self.moves],
            "backend": self.backend,
            "forks": len(self.trajectory.forks),
            "unseen_tail_tokens": self.unseen_tail_tokens,
        }


def _cut(text: str, limit: int = MAX_OBSERVATION_CHARS) -> str:
    if len(text) <= limit:
        return text
    half = limit // 2
    return f"{text[:half]}\n[... {len(text) - 2 * half} characters cut ...]\n{text[-half:]}"


def observation(result: ToolResult) -> str:
    """A tool result as the model reads it: the output, then what went wrong, if anything."""
    parts = [result.output.rstrip("\n")] if result.output else []
    if result.timed_out:
        parts.append("[the command timed out and was interrupted]")
    if result.error:
        parts.append(f"[error: {result.error}]")
    elif result.exit_code not in (0, None):
        parts.append(f"[exit code {result.exit_code}]")
    return _cut("\n".join(parts) if parts else "[no output]")


def _is_context_error(exc: UpstreamStatusError) -> bool:
    # vLLM: "This model's maximum context length is N tokens"; SGLang: "...longer than the model's context length".
    return isinstance(exc, ContextLengthExceeded) or (exc.status == 400 and "context length" in str(exc).lower())


class _Clock:
    """Model and tool time of an episode; the rest of its wall time is the farm's own."""

    def __init__(self) -> None:
        self.start = time.monotonic()
        self.model_s = 0.0
        self.tools_s = 0.0

    def timings(self) -> dict[str, float]:
        total = time.monotonic() - self.start
        return {
            "model_s": round(self.model_s, 6),
            "tools_s": round(self.tools_s, 6),
            "farm_s": round(max(total - self.model_s - self.tools_s, 0.0), 6),
            "total_s": round(total, 6),
        }


async def run_episode(
    *,
    llm: LLM,
    builder: TrajectoryBuilder,
    tools: Toolbox | None,
    sampling: SamplingParams,
    budgets: Budgets,
    deadline: float | None = None,
    is_cancelled: Callable[[], bool] = lambda: False,
    answer_in_text: bool = False,
    parsers: ParserNames | None = None,
) -> Episode:
    """Run one episode from ``builder``'s first prompt to its end (see the module docstring).

    Args:
        tools: the episode's tools; None for a plain question (the first reply is the answer).
        deadline: ``time.monotonic()`` after which the episode stops with ``agent_timeout``
            (the stage's own deadline); ``budgets.wall_time_s`` may make it earlier.
        answer_in_text: a reply without a tool call ends the episode (its text is the answer),
            instead of being answered with a reminder to call a tool.
        parsers: how the served model writes reasoning and tool calls (``farm.proxy.parsers.choose``);
            None: hermes calls, no reasoning (the tiny model's).

    Raises:
        UpstreamError: the backend failed (other than a context-length refusal).
        SandboxError: the sandbox failed (not a tool: a tool's failure is an observation).
    """
    clock = _Clock()
    if budgets.wall_time_s is not None:
        own = clock.start + budgets.wall_time_s
        deadline = own if deadline is None else min(deadline, own)
    specs = [dict(spec) for spec in tools.specs] if tools is not None else []
    reader = TurnReader(parsers, specs)
    episode = Episode(outcome=Outcome.OK, reason=None, trajectory=builder.build())

    def end(outcome: Outcome, reason: str | None) -> Episode:
        episode.outcome, episode.reason = outcome, reason
        episode.trajectory = builder.build()
        if not budgets.keep_unseen_tail:
            episode.unseen_tail_tokens = episode.trajectory.through_last_model_turn()
        episode.timings = clock.timings()
        episode.moves = list(llm.moves)
        episode.backend = llm.backend_id
        return episode

    def remaining() -> float | None:
        return None if deadline is None else deadline - time.monotonic()

    while True:
        if is_cancelled():
            return end(Outcome.CANCELLED, "the batch was cancelled")
        if episode.turns >= budgets.max_turns:
            return end(Outcome.AGENT_ERROR, f"the agent used all {budgets.max_turns} turns without finishing")
        left = remaining()
        if left is not None and left <= 0:
            return end(Outcome.AGENT_TIMEOUT, "the episode ran out of wall-clock time")
        max_tokens = sampling.max_tokens
        if budgets.max_tokens is not None:
            token_left = budgets.max_tokens - episode.sampled_tokens
            if token_left <= 0:
                return end(Outcome.AGENT_ERROR, f"the agent sampled its whole budget of {budgets.max_tokens} tokens")
            max_tokens = min(max_tokens, token_left)
        prompt = builder.prompt_ids
        if budgets.max_context_tokens is not None:
            room = budgets.max_context_tokens - len(prompt)
            if room <= 0:
                return end(
                    Outcome.CONTEXT_OVERFLOW,
                    f"the conversation ({len(prompt)} tokens) fills the context of {budgets.max_context_tokens}",
                )
            max_tokens = min(max_tokens, room)

        t0 = time.monotonic()
        try:
            call = llm.generate(prompt, sampling.model_copy(update={"max_tokens": max_tokens}))
            result = await until_cancelled(call if left is None else asyncio.wait_for(call, timeout=left), is_cancelled)
        except TimeoutError:
            return end(Outcome.AGENT_TIMEOUT, "the episode ran out of wall-clock time during a model call")
        except Cancelled:
            return end(Outcome.CANCELLED, "the batch was cancelled during a model call")
        except UpstreamStatusError as exc:
            if _is_context_error(exc):
                return end(Outcome.CONTEXT_OVERFLOW, f"the backend refused the prompt: {exc}")
            raise
        finally:
            clock.model_s += time.monotonic() - t0

        text = builder.text_of(result)
        turn = reader.read(text, prompt_tail=_prompt_tail(builder, prompt, reader))
        builder.add_completion(result, turn.message)
        episode.turns += 1
        episode.sampled_tokens += len(result.token_ids)
        episode.finish_reasons.append(result.finish_reason.value)
        episode.final_text = text
        if result.finish_reason is FinishReason.LENGTH and (
            budgets.max_context_tokens is not None and len(prompt) + len(result.token_ids) >= budgets.max_context_tokens
        ):
            return end(Outcome.CONTEXT_OVERFLOW, "the reply was cut off at the end of the context window")

        if tools is None:
            return end(Outcome.OK, None)
        if not turn.calls and not turn.errors:
            if answer_in_text:
                return end(Outcome.OK, None)
            try:
                builder.add_messages([{"role": "user", "content": reader.no_call_hint}])
            except TemplateRefused as exc:
                return end(Outcome.AGENT_ERROR, str(exc))
            continue

        messages: list[dict[str, Any]] = []
        if turn.errors:
            episode.bad_calls += len(turn.errors)
            answered = next((e.call_id for e in turn.errors if e.call_id), None)
            messages.append(
                {"role": "tool", "content": reader.errors_text(turn.errors)}
                | ({"tool_call_id": answered} if answered else {})
            )
        submit: ToolCall | None = None
        for tool_call in turn.calls:
            if tool_call.name == SUBMIT:
                submit = tool_call
                break  # calls after submit are not run: the work is graded as it stands
            episode.tool_calls += 1
            left = remaining()
            if left is not None and left <= 0:
                return end(Outcome.AGENT_TIMEOUT, "the episode ran out of wall-clock time")
            t0 = time.monotonic()
            try:
                tool_result = await asyncio.to_thread(tools.call, tool_call.name, tool_call.arguments, timeout_s=left)
            finally:
                clock.tools_s += time.monotonic() - t0
            seen = observation(tool_result)
            episode.actions.add(
                turn=episode.turns - 1, tool=tool_call.name, arguments=tool_call.arguments, observation=seen
            )
            messages.append({"role": "tool", "tool_call_id": tool_call.id, "name": tool_call.name, "content": seen})
        if submit is not None:
            episode.submitted = submit.arguments
            return end(Outcome.OK, None)
        try:
            builder.add_messages(messages)
        except TemplateRefused as exc:
            # The policy wrote what its family's template cannot render (two calls where it takes one).
            return end(Outcome.AGENT_ERROR, str(exc))


def _prompt_tail(builder: TrajectoryBuilder, prompt: list[int], reader: TurnReader) -> str:
    """The prompt's last text, where a reasoning parser reads the reply: whether the template closed
    the think block (DeepSeek-R1's llama.cpp copy without ``enable_thinking``), as the proxy asks."""
    if reader.parsers.reasoning == "none":
        return ""
    return str(builder.tokenizer.decode(prompt[-PROMPT_TAIL_IDS:], skip_special_tokens=False))
