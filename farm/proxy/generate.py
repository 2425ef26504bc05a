"""A call's second step: the backend samples, and the sampled ids become the harness's events.

Ids are decoded as they come (``TextDecoder``), cut at a stop string (``StopMatcher``), split into
reasoning and answer (a ``ReasoningParser``) and the answer into prose and tool calls (a
``ToolCallParser``), both chosen by ``farm.proxy.parsers``. Everything sampled is kept for the
record, whatever the harness is shown.
"""

from __future__ import annotations

import contextlib
import secrets
import time
from collections.abc import AsyncGenerator, AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from farm.errors import InvalidSpec
from farm.llm.client import StreamItem
from farm.llm.session import LLMSession
from farm.llm.types import FinishReason, GenerateResult, SamplingParams, StreamDelta, TopLogprobs
from farm.proxy.conversation import ChatRequest, CompletionRequest, Reply, ToolCall
from farm.proxy.events import Event, Finished, ReasoningDelta, Sampled, Started, TextDelta, ToolCallEvent, Usage
from farm.proxy.parsers import ParserNames, reasoning_parser, tool_call_parser
from farm.proxy.reasoning import Split
from farm.proxy.text import StopMatcher, TextDecoder
from farm.proxy.toolparse import CallPiece, Piece, TextPiece


@dataclass(frozen=True)
class Generated:
    """What a call sampled and answered, once its generation ended."""

    reply: Reply
    #: the model's reasoning, split from the reply's content.
    reasoning: str
    sampled: list[int]
    logprobs: list[float]
    backend_id: str | None
    cached_tokens: int | None
    #: (version, start, end) over ``sampled``.
    weight_versions: list[tuple[int, int, int]]
    first_token_s: float | None
    latency_s: float
    #: why the answer does not meet a tool_choice that demands a call (None: it does, or none was demanded).
    tool_choice_unmet: str | None


class Generation:
    """One answer of the backend to one prompt, as events (``events``), then ``generated``."""

    def __init__(
        self,
        *,
        tokenizer: Any,
        request: ChatRequest | CompletionRequest,
        sampling: SamplingParams,
        parsers: ParserNames,
        forced_ids: list[int],
        call_id_prefix: str,
        prompt_tail: str = "",
        end_ids: frozenset[int] = frozenset(),
    ) -> None:
        self.request = request
        self.sampling = sampling
        self._tokenizer = tokenizer
        stop_ids = set(sampling.stop_token_ids) | set(end_ids)
        if tokenizer.eos_token_id is not None:
            stop_ids.add(tokenizer.eos_token_id)
        self._decoder = TextDecoder(tokenizer, hidden_ids=stop_ids)
        self._stops = StopMatcher(request.sampling.stop)
        parse_calls = isinstance(request, ChatRequest) and bool(request.tools) and request.tool_choice != "none"
        self._reasoning = reasoning_parser(parsers.reasoning, prompt_tail=prompt_tail)
        self._reasoning_name, self._prompt_tail = parsers.reasoning, prompt_tail
        self._forced_ids = forced_ids
        self._reasons = parsers.reasoning != "none"
        tools = [tool.for_template()["function"] for tool in request.tools] if isinstance(request, ChatRequest) else []
        self._tools = tool_call_parser(parsers.tool_calls, parse_calls=parse_calls, tools=tools)
        self._one_call = parse_calls and isinstance(request, ChatRequest) and not request.parallel_tool_calls
        self._id_prefix = call_id_prefix
        self._content: list[str] = []
        self._reasoned: list[str] = []
        self._calls: list[ToolCall] = []
        self.sampled: list[int] = []
        self.logprobs: list[float] = []
        # Returned to the harness, not recorded: a trainer needs the sampled ids' logprobs only.
        self._tops: list[TopLogprobs] = []
        #: an event of the answer went out (a streamed call that fails then leaves the record incomplete).
        self.yielded = False
        self._generated: Generated | None = None
        # The forced opening of a call is read first: the model's ids continue it (through the
        # reasoning parser too, whose state follows what was written: a call's tag ends reasoning).
        forced = tokenizer.decode(forced_ids, skip_special_tokens=False) if forced_ids else ""
        self._forced_events = self._split(self._reasoning.push(forced)) if forced else []

    @property
    def generated(self) -> Generated:
        if self._generated is None:
            raise RuntimeError("the generation has not ended")
        return self._generated

    async def events(
        self, llm: LLMSession, prompt_ids: list[int], started: Callable[[], Awaitable[int]]
    ) -> AsyncIterator[Event]:
        """The answer's events; ``started`` gives the call's seq once its start is recorded, which
        the first event waits for (a call the harness sees is in the record).

        Raises:
            InvalidSpec: the backend's stream ended without a finish reason.
            Exception: whatever ``started`` or the backend raised.
        """
        request = self.request
        start = time.perf_counter()
        first_token_s: float | None = None
        seq: int | None = None
        finish: FinishReason | None = None
        stop_string: str | None = None
        cut_after_call = False
        backend_id: str | None = None
        cached: int | None = None
        versions: list[tuple[int, int, int]] = []
        # A streamed answer, or one a stop string or its first tool call may cut short (the rest
        # is then aborted), is read from the backend as it is decoded; any other is asked for
        # whole: one answer to parse instead of a chunk per token.
        num_top = request.top_logprobs if request.logprobs else 0
        if request.stream or request.sampling.stop or self._one_call:
            stream = llm.generate_stream(prompt_ids, self.sampling, top_logprobs=num_top)
        else:
            stream = _whole(llm, prompt_ids, self.sampling, num_top)
        # Closing the stream early (a stop string, a failure) closes the backend's request: it aborts.
        async with contextlib.aclosing(stream):
            async for item in stream:
                if isinstance(item, GenerateResult):
                    finish, backend_id, cached, versions = (
                        item.finish_reason,
                        item.backend_id,
                        item.cached_tokens,
                        item.weight_versions,
                    )
                    continue
                if first_token_s is None:
                    first_token_s = time.perf_counter() - start
                    seq = await started()
                    yield Started(seq=seq, prompt_tokens=len(prompt_ids))
                    for event in self._forced_events:  # text the template writes before a call's tag
                        self.yielded = True
                        yield event
                self.sampled += item.token_ids
                self.logprobs += item.logprobs
                self._tops += item.top_logprobs or []
                if request.stream and request.logprobs:
                    yield _sampled(self._tokenizer, item)
                text, stop_string = self._stops.push(self._decoder.push(item.token_ids))
                split = self._reasoning.push(text)
                thought = self._thought(split.reasoning)
                pieces = self._tools.push(split.content)
                if self._one_call:
                    pieces, cut_after_call = _through_first_call(pieces)
                for event in [*thought, *self._events(pieces)]:
                    self.yielded = True
                    yield event
                if stop_string is not None or cut_after_call:
                    break  # the rest of the answer is not wanted
        if seq is None:
            seq = await started()
        if cut_after_call:
            # What was sampled past the call stays in the record (the next prompt continues from
            # it); the harness is shown none of it.
            stop_string = None
        else:
            tail, hit = self._stops.push(self._decoder.flush(), final=stop_string is None)
            stop_string = stop_string or hit
            tail_split, last = self._reasoning.push(tail), self._reasoning.finish()
            rest = tail_split.content + last.content
            thought = self._thought(tail_split.reasoning + last.reasoning)
            for event in [*thought, *self._events([*self._tools.push(rest), *self._tools.finish()])]:
                self.yielded = True
                yield event
        if stop_string is not None or cut_after_call:
            finish = FinishReason.STOP
            backend_id = backend_id or llm.backend_id
        if finish is None:
            raise InvalidSpec("the backend's stream ended without a finish reason")
        calls = self._calls
        reply = Reply(
            content="".join(self._content),
            tool_calls=calls,
            finish_reason="length" if finish is FinishReason.LENGTH else ("tool_calls" if calls else "stop"),
            stop_string=stop_string,
            cut_after_call=cut_after_call,
        )
        sampled = len(self.sampled)
        self._generated = Generated(
            reply=reply,
            reasoning="".join(self._reasoned),
            sampled=self.sampled,
            logprobs=self.logprobs,
            backend_id=backend_id,
            cached_tokens=cached,
            # A stop string cuts the answer short: spans past what was kept are dropped.
            weight_versions=[(v, s, min(e, sampled)) for v, s, e in versions if s < sampled],
            first_token_s=first_token_s,
            latency_s=time.perf_counter() - start,
            tool_choice_unmet=_unmet(request, calls, finish) if isinstance(request, ChatRequest) else None,
        )

    def finished(self, seq: int, prompt_ids: list[int]) -> Finished:
        """The last event, once the answer is recorded as call ``seq``."""
        done = self.generated
        request = self.request
        texts: list[str] = []
        top_texts: list[list[tuple[str, float]]] = []
        if request.logprobs:
            # Each distinct id decoded once: k top tokens per position repeat a lot.
            wanted = set(done.sampled).union(*(top.keys() for top in self._tops))
            decoded = {t: self._tokenizer.decode([t], skip_special_tokens=False) for t in wanted}
            texts = [decoded[t] for t in done.sampled]
            top_texts = [[(decoded[t], lp) for t, lp in top.items()] for top in self._tops[: len(done.sampled)]]
        usage = Usage(
            prompt_tokens=len(prompt_ids),
            completion_tokens=len(done.sampled),
            cached_tokens=done.cached_tokens,
            reasoning_tokens=(self._count_reasoning(done) if done.reasoning else 0) if self._reasons else None,
        )
        return Finished(
            reply=done.reply,
            usage=usage,
            seq=seq,
            token_ids=done.sampled,
            logprobs=done.logprobs,
            token_texts=texts,
            prompt_ids=prompt_ids if isinstance(request, CompletionRequest) and request.prompt_ids else [],
            top_logprobs=top_texts,
            reasoning=done.reasoning,
        )

    def _count_reasoning(self, done: Generated) -> int:
        """The sampled tokens whose text the reasoning parser read as reasoning: each id read again,
        one at a time, after the forced opening (an answer that reasoned only; tags count as none)."""
        parser = reasoning_parser(self._reasoning_name, prompt_tail=self._prompt_tail)
        decoder = TextDecoder(self._tokenizer, hidden_ids=self._decoder.hidden)
        if self._forced_ids:
            parser.push(decoder.push(self._forced_ids))
        count = 0
        for token_id in done.sampled:
            count += bool(parser.push(decoder.push([token_id])).reasoning)
        return count

    def _thought(self, text: str) -> list[Event]:
        if not text:
            return []
        self._reasoned.append(text)
        return [ReasoningDelta(text)]

    def _split(self, split: Split) -> list[Event]:
        return [*self._thought(split.reasoning), *self._events(self._tools.push(split.content))]

    def _events(self, pieces: list[Piece]) -> list[Event]:
        events: list[Event] = []
        for piece in pieces:
            if isinstance(piece, TextPiece):
                self._content.append(piece.text)
                events.append(TextDelta(piece.text))
            else:
                call = ToolCall(
                    id=f"{self._id_prefix}{secrets.token_hex(12)}", name=piece.name, arguments=piece.arguments
                )
                events.append(ToolCallEvent(index=len(self._calls), call=call))
                self._calls.append(call)
        return events


def _sampled(tokenizer: Any, item: StreamDelta) -> Sampled:
    decoded: dict[int, str] = {}

    def text(token: int) -> str:
        if token not in decoded:
            decoded[token] = tokenizer.decode([token], skip_special_tokens=False)
        return decoded[token]

    tops = [[(text(t), lp) for t, lp in top.items()] for top in item.top_logprobs or []]
    return Sampled([text(t) for t in item.token_ids], list(item.logprobs), tops)


async def _whole(
    llm: LLMSession, prompt_ids: list[int], sampling: SamplingParams, top_logprobs: int
) -> AsyncGenerator[StreamItem, None]:
    """One non-streamed generation in the shape of a stream: all its ids, then the result."""
    result = await llm.generate(prompt_ids, sampling, top_logprobs=top_logprobs)
    yield StreamDelta(
        token_ids=list(result.token_ids), logprobs=list(result.logprobs), top_logprobs=result.top_logprobs
    )
    yield result


def _through_first_call(pieces: list[Piece]) -> tuple[list[Piece], bool]:
    """The pieces up to and including the first call, and whether there was one."""
    for i, piece in enumerate(pieces):
        if isinstance(piece, CallPiece):
            return pieces[: i + 1], True
    return pieces, False


def _unmet(request: ChatRequest, calls: list[ToolCall], finish: FinishReason) -> str | None:
    """Why the answer does not meet a tool_choice that demands a call (None: it does, or none was demanded)."""
    choice = request.tool_choice
    if choice in ("auto", "none"):
        return None
    if not calls:
        cut = " (max_tokens ran out)" if finish is FinishReason.LENGTH else ""
        return f"tool_choice={choice}: the model did not complete a well-formed tool call{cut}"
    name = calls[0].name
    if choice == "required" and name not in {t.name for t in request.tools}:
        return f"tool_choice=required: the model called {name!r}, which is not among the tools"
    if choice != "required" and name != choice:
        return f"tool_choice={choice}: the model called {name!r}"
    return None
