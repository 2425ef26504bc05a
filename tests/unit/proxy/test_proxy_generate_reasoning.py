"""``Generation`` with a reasoning parser: reasoning goes out as ``ReasoningDelta`` before the answer,
every sampled id is kept, and a call opening the proxy forced is the answer's (not reasoning)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

from farm.llm.types import FinishReason, GenerateResult, SamplingParams, StreamDelta
from farm.proxy.conversation import ChatRequest, Message, Tool
from farm.proxy.events import Event, ReasoningDelta, Started, TextDelta, ToolCallEvent
from farm.proxy.generate import Generation
from farm.proxy.parsers import ParserNames

QWEN3 = ParserNames(tool_calls="hermes", reasoning="qwen3")


class _ScriptedLLM:
    """Streams the given ids a few at a time, as a backend would."""

    backend_id = "b"

    def __init__(self, ids: list[int]) -> None:
        self.ids = ids

    async def generate_stream(self, prompt_ids: list[int], sampling: Any, top_logprobs: int = 0) -> AsyncIterator[Any]:
        for i in range(0, len(self.ids), 2):
            chunk = self.ids[i : i + 2]
            yield StreamDelta(token_ids=chunk, logprobs=[-0.5] * len(chunk))
        yield GenerateResult(
            token_ids=self.ids,
            logprobs=[-0.5] * len(self.ids),
            finish_reason=FinishReason.STOP,
            prompt_tokens=1,
            backend_id="b",
        )


def _run(
    tokenizer: Any, text: str, request: ChatRequest, forced: str = ""
) -> tuple[Generation, list[Event], list[int]]:
    ids = tokenizer.encode(text, add_special_tokens=False) + [tokenizer.eos_token_id]
    forced_ids = tokenizer.encode(forced, add_special_tokens=False) if forced else []
    generation = Generation(
        tokenizer=tokenizer,
        request=request,
        sampling=SamplingParams(),
        parsers=QWEN3,
        forced_ids=forced_ids,
        call_id_prefix="call_",
    )

    async def started() -> int:
        return 0

    async def collect() -> list[Event]:
        return [e async for e in generation.events(_ScriptedLLM(ids), [1], started)]  # type: ignore[arg-type]

    return generation, asyncio.run(collect()), ids


def test_reasoning_goes_out_before_the_answer_and_every_id_is_kept(tiny_tokenizer: Any) -> None:
    request = ChatRequest(messages=[Message(role="user", content="hi")], stream=True)
    generation, events, ids = _run(tiny_tokenizer, "<think>\nplan\n</think>\n\nhello", request)
    assert isinstance(events[0], Started)
    thought = "".join(e.text for e in events if isinstance(e, ReasoningDelta))
    said = "".join(e.text for e in events if isinstance(e, TextDelta))
    assert (thought, said) == ("\nplan\n", "\n\nhello")
    last_thought = max(i for i, e in enumerate(events) if isinstance(e, ReasoningDelta))
    assert all(not isinstance(e, TextDelta) or not e.text for e in events[:last_thought])
    done = generation.generated
    assert (done.reasoning, done.reply.content) == ("\nplan\n", "\n\nhello")
    assert done.sampled == ids  # the reasoning's ids are recorded like any other
    assert generation.finished(0, [1]).reasoning == "\nplan\n"


def test_a_forced_call_opening_is_the_answer_s_not_reasoning(tiny_tokenizer: Any) -> None:
    request = ChatRequest(
        messages=[Message(role="user", content="hi")], tools=[Tool(name="bash")], tool_choice="required", stream=True
    )
    generation, events, _ = _run(
        tiny_tokenizer,
        'bash", "arguments": {"command": "ls"}}\n</tool_call>',
        request,
        forced='<tool_call>\n{"name": "',
    )
    assert not [e for e in events if isinstance(e, ReasoningDelta)]
    (call,) = [e for e in events if isinstance(e, ToolCallEvent)]
    assert (call.call.name, call.call.arguments) == ("bash", '{"command": "ls"}')
    assert generation.generated.tool_choice_unmet is None
