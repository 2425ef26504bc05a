"""The built-in agent loop on the real families' family_tokenizer and templates: each family's reasoning and
tool-call format read by the proxy's parsers, the assistant message structured as its template wants
it, and the history policy as the proxy applies it (Qwen3 and DeepSeek-R1 rewrite past turns: one
segment under ``exact``, a new one per rewrite under ``template``; Llama 3 and Qwen3-Coder rewrite
nothing). The model is scripted: each turn's ids are the text's, then the end of turn."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

from farm.agent.loop import Budgets, Episode, run_episode
from farm.agent.toolbox import ToolSpecs, system_prompt
from farm.agent.turns import TurnReader
from farm.config import ProxySettings
from farm.constants import Outcome
from farm.llm.rendering import ChatRenderer
from farm.llm.trajectory import TokenSegment, TrajectoryBuilder
from farm.llm.types import FinishReason, GenerateResult, SamplingParams
from farm.proxy.parsers import choose
from farm.testing import ScriptedLLM
from farm.tools.base import ToolResult

ECHO = {
    "name": "echo",
    "description": "repeat text",
    "parameters": {"type": "object", "properties": {"text": {"type": "string"}}, "required": ["text"]},
}
SUBMIT = {"name": "submit", "description": "done", "parameters": {"type": "object", "properties": {}}}
FIRST = [{"role": "system", "content": "be brief"}, {"role": "user", "content": "echo a, then b"}]


def hermes(name: str, arguments: str) -> str:
    return f'<tool_call>\n{{"name": "{name}", "arguments": {arguments}}}\n</tool_call>'


class EchoTools:
    def __init__(self) -> None:
        self.calls: list[tuple[str, dict[str, Any]]] = []

    @property
    def specs(self) -> list[dict[str, Any]]:
        return [ECHO, SUBMIT]

    def call(self, name: str, arguments: dict[str, Any], *, timeout_s: float | None) -> ToolResult:
        self.calls.append((name, arguments))
        return ToolResult(output=f"echo: {arguments['text']}")


class Run:
    """One scripted episode, and what it is checked against."""

    def __init__(self, tok: Any, turns: list[str], history: str, **template: Any) -> None:
        self.tok, self.turns = tok, turns
        self.tools = EchoTools()
        self.llm = ScriptedLLM(tok, turns)
        parsers = choose(ProxySettings(), tok.chat_template)
        self.builder = TrajectoryBuilder(
            tokenizer=tok,
            messages=list(FIRST),
            tools=[{"type": "function", "function": spec} for spec in self.tools.specs],
            history=history,  # type: ignore[arg-type]
            # As the agent handler: the family's template kwargs unless the test sets its own.
            chat_template_kwargs=template or dict(parsers.template_kwargs) or None,
        )
        self.episode: Episode = asyncio.run(
            run_episode(
                llm=self.llm,
                builder=self.builder,
                tools=self.tools,
                sampling=SamplingParams(max_tokens=300),
                budgets=Budgets(max_turns=len(turns)),
                parsers=parsers,
            )
        )

    @property
    def segments(self) -> list[TokenSegment]:
        trajectory = self.episode.trajectory
        return [*(fork.before for fork in trajectory.forks), trajectory.as_segment()]

    def check_token_exact(self) -> None:
        """Every sampled id in its place, in order; mask 1 exactly on them; each prompt the model was
        given is its segment up to the turn it sampled."""
        sampled = [[*self.tok.encode(text, add_special_tokens=False), self.tok.eos_token_id] for text in self.turns]
        found, prompts = [], []
        for segment in self.segments:
            spans = [span for span in segment.turns if span.kind == "model"]
            found += [segment.token_ids[span.start : span.end] for span in spans]
            prompts += [segment.token_ids[: span.start] for span in spans]
            inside = {i for span in spans for i in range(span.start, span.end)}
            assert segment.loss_mask == [int(i in inside) for i in range(len(segment.token_ids))]
        assert found == sampled[: len(found)] and len(found) == self.episode.turns
        assert prompts == self.llm.prompts


QWEN3_TURNS = [
    "<think>\nlook first\n</think>\n\n" + hermes("echo", '{"text": "a"}'),
    "<think>\nnow b\n</think>\n\nI will echo b.\n" + hermes("echo", '{"text": "b"}'),
    "<think>\nthat is all\n</think>\n\nI am done.",  # no call: the loop answers with a user turn
    "<think>\nsubmit it\n</think>\n\n" + hermes("submit", "{}"),
]


def test_qwen3_reasoning_and_calls_one_segment_under_exact(family_tokenizer: Callable[[str], Any]) -> None:
    run = Run(family_tokenizer("qwen3"), QWEN3_TURNS, "exact")
    assert run.episode.outcome is Outcome.OK and run.episode.turns == 4
    assert run.episode.trajectory.forks == [] and run.episode.info()["forks"] == 0
    run.check_token_exact()
    assert run.tools.calls == [("echo", {"text": "a"}), ("echo", {"text": "b"})]
    # The messages as Qwen3's template wants them: reasoning split, calls structured, results answering them.
    reply, result = run.builder.messages[2], run.builder.messages[3]
    assert reply["reasoning_content"].strip() == "look first"
    (call,) = reply["tool_calls"]
    assert call["type"] == "function" and call["function"] == {"name": "echo", "arguments": {"text": "a"}}
    assert result == {"role": "tool", "tool_call_id": call["id"], "name": "echo", "content": "echo: a"}
    assert run.builder.messages[4]["content"].strip() == "I will echo b."
    # The template wrote the tools and how to call them into the first prompt.
    first = run.tok.decode(run.llm.prompts[0])
    assert "<tools>" in first and '"name": "echo"' in first


def test_qwen3_template_policy_starts_a_segment_where_the_template_drops_reasoning(
    family_tokenizer: Callable[[str], Any],
) -> None:
    run = Run(family_tokenizer("qwen3"), QWEN3_TURNS, "template")
    assert run.episode.outcome is Outcome.OK
    # Tool results keep the turn in one query, whose replies keep their reasoning; the loop's user
    # turn (no call found) starts a new query, and Qwen3 renders the earlier replies without it.
    forks = run.episode.trajectory.forks
    assert [fork.reason for fork in forks] == [
        "the template renders the earlier turns differently once the new messages follow"
    ]
    run.check_token_exact()
    last = run.segments[-1]
    assert last.token_ids[: len(run.llm.prompts[-1])] == run.builder.renderer.fresh(
        run.builder.messages[:-1], run.builder.tools
    )


def test_qwen3_coder_calls_in_its_own_format(family_tokenizer: Callable[[str], Any]) -> None:
    def call(name: str, **arguments: str) -> str:
        params = "".join(f"<parameter={key}>\n{value}\n</parameter>\n" for key, value in arguments.items())
        return f"<tool_call>\n<function={name}>\n{params}</function>\n</tool_call>"

    turns = [
        "Let me echo.\n" + call("echo", text="a"),
        call("echo", txt="b"),  # an argument the tool does not take
        "<tool_call>\n<function=echo>\n<parameter=text>\nb",  # unclosed: prose to the parser
        call("submit"),
    ]
    for history in ("exact", "template"):
        run = Run(family_tokenizer("qwen3-coder"), turns, history)
        assert run.episode.outcome is Outcome.OK and run.episode.trajectory.forks == []
        run.check_token_exact()
        assert run.tools.calls == [("echo", {"text": "a"})] and run.episode.bad_calls == 1
        assert run.builder.messages[2]["content"] == "Let me echo.\n"
        prompts = [run.tok.decode(prompt) for prompt in run.llm.prompts]
        assert "missing required argument 'text'" in prompts[2] and "<function=NAME>" in prompts[2]
        assert "No tool call found. Call a tool as <tool_call>\n<function=NAME>" in prompts[3]


def test_llama3_json_calls_and_a_template_that_rewrites_nothing(family_tokenizer: Callable[[str], Any]) -> None:
    turns = [
        '{"name": "echo", "parameters": {"text": "a"}}',
        "All echoed.",
        '{"name": "submit", "parameters": {}}',
    ]
    runs = [Run(family_tokenizer("llama3"), turns, history) for history in ("exact", "template")]
    for run in runs:
        assert run.episode.outcome is Outcome.OK and run.episode.trajectory.forks == []
        run.check_token_exact()
        assert run.tools.calls == [("echo", {"text": "a"})]
        assert 'Call a tool as {"name": ..., "parameters": {...}}' in run.tok.decode(run.llm.prompts[2])
    assert runs[0].episode.trajectory.token_ids == runs[1].episode.trajectory.token_ids
    # Two calls in one reply: Llama 3.1's template renders one per reply, so the episode ends there.
    both = '{"name": "echo", "parameters": {"text": "a"}}; {"name": "echo", "parameters": {"text": "b"}}'
    refused = Run(family_tokenizer("llama3"), [both], "exact")
    assert refused.episode.outcome is Outcome.AGENT_ERROR and refused.tools.calls == [
        ("echo", {"text": "a"}),
        ("echo", {"text": "b"}),
    ]
    assert "only supports single tool-calls" in (refused.episode.reason or "")


def test_deepseek_r1_reasoning_split_one_segment_under_exact(family_tokenizer: Callable[[str], Any]) -> None:
    # Thinking on by the family's default (llama.cpp's copy of the template closes <think> without
    # enable_thinking): the generation prompt opens <think>, the model's text starts inside its reasoning.
    assert choose(ProxySettings(), family_tokenizer("deepseek-r1").chat_template).template_kwargs == {
        "enable_thinking": True
    }
    turns = [
        "I should echo a.\n</think>\n\n" + hermes("echo", '{"text": "a"}'),
        "Now b.\n</think>\n\nEchoing b." + hermes("echo", '{"text": "b"}'),
        "Done.\n</think>\n\n" + hermes("submit", "{}"),
    ]
    exact = Run(family_tokenizer("deepseek-r1"), turns, "exact", enable_thinking=True)
    assert exact.episode.outcome is Outcome.OK and exact.episode.trajectory.forks == []
    exact.check_token_exact()
    assert [m["reasoning_content"] for m in exact.builder.messages if m["role"] == "assistant"] == [
        "I should echo a.\n",
        "Now b.\n",
        "Done.\n",
    ]
    assert exact.tools.calls == [("echo", {"text": "a"}), ("echo", {"text": "b"})]
    # Its template drops the reasoning of a reply once more follows it (and it then writes later tool
    # results as a continuation of the first one's block, which extends).
    template = Run(family_tokenizer("deepseek-r1"), turns, "template", enable_thinking=True)
    assert template.episode.outcome is Outcome.OK
    assert [fork.reason for fork in template.episode.trajectory.forks] == [
        "the template renders the earlier turns differently once a reply follows them"
    ]
    template.check_token_exact()


def test_deepseek_r1_with_thinking_off_reads_the_reply_as_content(family_tokenizer: Callable[[str], Any]) -> None:
    # A prompt that closed the think block (enable_thinking false) makes the reply content, as the
    # proxy reads it: nothing is split off as reasoning, and the call in it is still read.
    # (One turn: after a tool result this template writes no generation prompt at all.)
    run = Run(
        family_tokenizer("deepseek-r1"),
        ["Echoing a.\n" + hermes("echo", '{"text": "a"}')],
        "exact",
        enable_thinking=False,
    )
    assert run.tok.decode(run.llm.prompts[0]).rstrip().endswith("</think>")
    assert run.tools.calls == [("echo", {"text": "a"})]
    reply = run.builder.messages[2]
    assert reply["content"] == "Echoing a.\n" and "reasoning_content" not in reply, reply
    run.check_token_exact()


def test_a_template_that_describes_the_tools_leaves_the_system_prompt_to_the_intro(
    family_tokenizer: Callable[[str], Any], tiny_tokenizer: Any
) -> None:
    assert not ChatRenderer(tiny_tokenizer).renders_tools()
    assert ChatRenderer(family_tokenizer("qwen3")).renders_tools()
    specs = [ECHO, SUBMIT]
    # The tiny model's template ignores tools: the prompt describes them, as it always did.
    described = system_prompt("Do it.", ToolSpecs(specs))
    assert described == system_prompt("Do it.", specs) and "<tool_call>" in described and "## echo" in described
    assert system_prompt("Do it.", ToolSpecs(specs, described_by_template=True)) == (
        "Do it.\n\nWhen you are done, call submit."
    )
    coder = system_prompt("Do it.", ToolSpecs(specs, call_format="qwen3_coder"))
    assert "<function=NAME>" in coder and "## echo" in coder


def test_phi3_reply_ends_at_its_end_of_turn_id_not_in_the_recorded_text(family_tokenizer: Callable[[str], Any]) -> None:
    # Phi-3 ends a turn with <|end|> (generation_config.json), not its tokenizer's eos <|endoftext|>:
    # a reply stopped there is recorded without it, as the proxy answers it.
    tok = family_tokenizer("phi-3")
    end = tok.convert_tokens_to_ids("<|end|>")
    assert end != tok.eos_token_id
    builder = TrajectoryBuilder(tokenizer=tok, messages=[{"role": "user", "content": "hi"}])
    ids = [*tok.encode("Hello there.", add_special_tokens=False), end]
    result = GenerateResult(
        token_ids=ids, logprobs=[0.0] * len(ids), finish_reason=FinishReason.STOP, prompt_tokens=1, backend_id="b"
    )
    text = builder.text_of(result)
    turn = TurnReader(choose(ProxySettings(), tok.chat_template)).read(text)
    assert builder.add_completion(result, turn.message) == text == "Hello there."
    assert builder.messages[-1] == {"role": "assistant", "content": "Hello there."}
    # The sampled ids are kept whole: <|end|> is the model's, with its logprob and mask 1.
    assert builder.build().token_ids[-len(ids) :] == ids
