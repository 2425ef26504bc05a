"""The agent loop against a scripted model and an in-memory toolbox: every way an episode ends."""

from __future__ import annotations

import asyncio
import time
from typing import Any

import pytest

from farm.agent.loop import NO_CALL_HINT, Budgets, run_episode
from farm.agent.toolcalls import format_call
from farm.constants import Outcome
from farm.errors import UpstreamStatusError, UpstreamTimeout
from farm.llm.trajectory import TrajectoryBuilder
from farm.llm.types import SamplingParams
from farm.testing import ScriptedLLM
from farm.tools.base import ToolResult

ECHO_SPEC = {
    "name": "echo",
    "description": "repeat text",
    "parameters": {"type": "object", "properties": {"text": {"type": "string"}}, "required": ["text"]},
}
SUBMIT_SPEC = {"name": "submit", "description": "done", "parameters": {"type": "object", "properties": {}}}


class EchoTools:
    def __init__(self, delay_s: float = 0.0) -> None:
        self.calls: list[tuple[str, dict[str, Any], float | None]] = []
        self.delay_s = delay_s

    @property
    def specs(self) -> list[dict[str, Any]]:
        return [ECHO_SPEC, SUBMIT_SPEC]

    def call(self, name: str, arguments: dict[str, Any], *, timeout_s: float | None) -> ToolResult:
        self.calls.append((name, arguments, timeout_s))
        time.sleep(self.delay_s)
        return ToolResult(output=f"echo: {arguments['text']}")


def _episode(tokenizer: Any, turns: list[str], *, tools: Any = None, budgets: Budgets | None = None, **kw: Any) -> Any:
    llm = kw.pop("llm", None) or ScriptedLLM(tokenizer, turns)
    builder = TrajectoryBuilder(tokenizer=tokenizer, messages=[{"role": "user", "content": "go"}])
    episode = asyncio.run(
        run_episode(
            llm=llm,
            builder=builder,
            tools=tools if tools is not None else EchoTools(),
            sampling=SamplingParams(max_tokens=500),
            budgets=budgets or Budgets(max_turns=5),
            **kw,
        )
    )
    return episode, llm


def test_tool_calls_run_and_submit_ends(tiny_tokenizer: Any) -> None:
    tools = EchoTools()
    episode, llm = _episode(
        tiny_tokenizer,
        [format_call("echo", {"text": "hi"}), format_call("submit", {}) + format_call("echo", {"text": "late"})],
        tools=tools,
    )
    assert episode.outcome is Outcome.OK and episode.reason is None
    assert episode.turns == 2 and episode.submitted == {}
    assert [c[0] for c in tools.calls] == ["echo"]  # the call after submit is not run
    assert "<tool_response>\necho: hi\n</tool_response>" in tiny_tokenizer.decode(llm.prompts[1])
    t = episode.trajectory
    # Loss mask is 1 exactly on the sampled ids, and the sampled ids are stored unchanged.
    sampled = [i for span in t.turns if span.kind == "model" for i in range(span.start, span.end)]
    assert [i for i, m in enumerate(t.loss_mask) if m] == sampled
    assert t.token_ids[: len(llm.prompts[1])] == llm.prompts[1]
    assert set(episode.timings) == {"model_s", "tools_s", "farm_s", "total_s"}


def test_malformed_and_unknown_calls_become_observations(tiny_tokenizer: Any) -> None:
    tools = EchoTools()
    turns = [
        "<tool_call>{not json}</tool_call>",
        format_call("rm_rf", {}),
        format_call("echo", {"txt": "typo"}),
        format_call("submit", {}),
    ]
    episode, llm = _episode(tiny_tokenizer, turns, tools=tools)
    assert episode.outcome is Outcome.OK and episode.bad_calls == 3 and not tools.calls
    second, third, fourth = (tiny_tokenizer.decode(p) for p in llm.prompts[1:4])
    assert "is not valid JSON" in second
    assert "unknown tool 'rm_rf'" in third and "available tools: echo, submit" in third
    assert "missing required argument 'text'" in fourth


def test_reply_without_call_gets_a_hint_or_ends_as_answer(tiny_tokenizer: Any) -> None:
    episode, llm = _episode(tiny_tokenizer, ["I think I am done.", format_call("submit", {})])
    assert episode.turns == 2 and NO_CALL_HINT in tiny_tokenizer.decode(llm.prompts[1])
    answered, _ = _episode(tiny_tokenizer, ["The answer is 4."], answer_in_text=True)
    assert answered.outcome is Outcome.OK and answered.turns == 1 and answered.final_text == "The answer is 4."


def test_turn_and_token_budgets_are_agent_errors(tiny_tokenizer: Any) -> None:
    loop = [format_call("echo", {"text": "again"})]
    by_turns, _ = _episode(tiny_tokenizer, loop, budgets=Budgets(max_turns=3))
    assert by_turns.outcome is Outcome.AGENT_ERROR and by_turns.turns == 3
    by_tokens, _ = _episode(tiny_tokenizer, loop, budgets=Budgets(max_turns=50, max_tokens=60))
    assert by_tokens.outcome is Outcome.AGENT_ERROR and "60 tokens" in (by_tokens.reason or "")
    assert by_tokens.sampled_tokens <= 60


def test_context_budget_is_context_overflow(tiny_tokenizer: Any) -> None:
    loop = [format_call("echo", {"text": "x" * 50})]
    episode, _ = _episode(tiny_tokenizer, loop, budgets=Budgets(max_turns=50, max_context_tokens=300))
    assert episode.outcome is Outcome.CONTEXT_OVERFLOW
    assert len(episode.trajectory.token_ids) <= 300


def test_a_conversation_that_fills_the_context_ends_before_the_model_is_called(tiny_tokenizer: Any) -> None:
    full = len(TrajectoryBuilder(tokenizer=tiny_tokenizer, messages=[{"role": "user", "content": "go"}]).prompt_ids)
    episode, llm = _episode(tiny_tokenizer, ["unused"], budgets=Budgets(max_turns=5, max_context_tokens=full))
    assert episode.outcome is Outcome.CONTEXT_OVERFLOW and llm.prompts == []


def test_a_reply_cut_by_the_token_budget_far_from_the_context_end_is_no_overflow(tiny_tokenizer: Any) -> None:
    loop = [format_call("echo", {"text": "again"})]
    budgets = Budgets(max_turns=50, max_tokens=60, max_context_tokens=4000)
    episode, _ = _episode(tiny_tokenizer, loop, budgets=budgets)
    assert episode.outcome is Outcome.AGENT_ERROR and "60 tokens" in (episode.reason or "")


class RefusingLLM(ScriptedLLM):
    def __init__(self, tokenizer: Any, error: Exception) -> None:
        super().__init__(tokenizer, ["unused"])
        self.error = error

    async def generate(self, prompt_ids: list[int], sampling: SamplingParams | None = None) -> Any:
        raise self.error


def test_backend_context_refusal_is_context_overflow_other_errors_raise(tiny_tokenizer: Any) -> None:
    refusal = UpstreamStatusError(
        "LLM backend answered 400: This model's maximum context length is 2048 tokens.", status=400
    )
    episode, _ = _episode(tiny_tokenizer, [], llm=RefusingLLM(tiny_tokenizer, refusal))
    assert episode.outcome is Outcome.CONTEXT_OVERFLOW
    with pytest.raises(UpstreamTimeout):
        _episode(tiny_tokenizer, [], llm=RefusingLLM(tiny_tokenizer, UpstreamTimeout("slow")))
    with pytest.raises(UpstreamStatusError):
        # Only a 400 is a refusal of the prompt, whatever the text of another status says.
        boom = UpstreamStatusError("LLM backend answered 500: context length cache lost", status=500)
        _episode(tiny_tokenizer, [], llm=RefusingLLM(tiny_tokenizer, boom))


class SlowLLM(ScriptedLLM):
    async def generate(self, prompt_ids: list[int], sampling: SamplingParams | None = None) -> Any:
        await asyncio.sleep(5)
        return await super().generate(prompt_ids, sampling)


def test_wall_clock_budget_is_agent_timeout(tiny_tokenizer: Any) -> None:
    started = time.monotonic()
    episode, _ = _episode(tiny_tokenizer, [], llm=SlowLLM(tiny_tokenizer, ["x"]), budgets=Budgets(wall_time_s=0.3))
    assert episode.outcome is Outcome.AGENT_TIMEOUT
    assert time.monotonic() - started < 4  # the model call in flight was cut off
    tools = EchoTools(delay_s=0.4)
    two_calls = format_call("echo", {"text": "a"}) + format_call("echo", {"text": "b"})
    by_tools, _ = _episode(tiny_tokenizer, [two_calls], tools=tools, deadline=time.monotonic() + 0.3)
    assert by_tools.outcome is Outcome.AGENT_TIMEOUT
    assert tools.calls[0][2] is not None and tools.calls[0][2] <= 0.3  # the tool got the time left
    assert [c[1]["text"] for c in tools.calls] == ["a"]  # the time ran out before the second call


def test_cancel_stops_before_the_next_turn(tiny_tokenizer: Any) -> None:
    turns_seen: list[int] = []

    def cancelled() -> bool:
        turns_seen.append(1)
        return len(turns_seen) > 2

    episode, _ = _episode(tiny_tokenizer, [format_call("echo", {"text": "a"})], is_cancelled=cancelled)
    assert episode.outcome is Outcome.CANCELLED and episode.turns == 2


def _ends_with_its_last_model_turn(trajectory: Any) -> None:
    assert trajectory.turns[-1].kind == "model" and trajectory.turns[-1].end == len(trajectory.token_ids)
    assert len(trajectory.token_ids) == len(trajectory.logprobs) == len(trajectory.loss_mask)
    assert trajectory.loss_mask[-1] == 1


def test_an_episode_out_of_turns_ends_with_the_last_tokens_the_model_sampled(tiny_tokenizer: Any) -> None:
    loop = [format_call("echo", {"text": "again"})]
    cut, _ = _episode(tiny_tokenizer, loop, budgets=Budgets(max_turns=3))
    _ends_with_its_last_model_turn(cut.trajectory)
    assert cut.info()["unseen_tail_tokens"] > 0
    # Asked for, the observation and generation prompt the model never saw are kept.
    kept, _ = _episode(tiny_tokenizer, loop, budgets=Budgets(max_turns=3, keep_unseen_tail=True))
    assert kept.trajectory.turns[-1].kind != "model"
    assert len(kept.trajectory.token_ids) == len(cut.trajectory.token_ids) + cut.info()["unseen_tail_tokens"]
    assert kept.trajectory.token_ids[: len(cut.trajectory.token_ids)] == cut.trajectory.token_ids


def test_an_episode_out_of_context_fits_the_context(tiny_tokenizer: Any) -> None:
    loop = [format_call("echo", {"text": "x" * 50})]
    for limit in (300, 450, 600):
        episode, _ = _episode(tiny_tokenizer, loop, budgets=Budgets(max_turns=50, max_context_tokens=limit))
        assert episode.outcome is Outcome.CONTEXT_OVERFLOW
        _ends_with_its_last_model_turn(episode.trajectory)
        assert len(episode.trajectory.token_ids) <= limit


def test_an_episode_that_finishes_loses_nothing(tiny_tokenizer: Any) -> None:
    episode, _ = _episode(tiny_tokenizer, [format_call("echo", {"text": "a"}), format_call("submit", {})])
    assert episode.outcome is Outcome.OK and episode.info()["unseen_tail_tokens"] == 0
    _ends_with_its_last_model_turn(episode.trajectory)
