"""The proxy's one path for every wire format: authenticate, render, generate, record, answer.

``ProxyCore.call`` is an async iterator of events: text deltas and tool calls as the model writes
them, then ``Finished``. ``Finished`` is yielded only after the call's record (prompt ids, sampled
ids, logprobs, the reply given) is committed, so a format adapter that sends its final chunk on
``Finished`` never shows a harness an answer the record lacks.

State lives in PostgreSQL (the record) and Redis (the balancer's sticky backend per trial), so any
proxy process serves any trial. A process keeps the ids of recent calls in memory; another process
rebuilds them from the record.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import secrets
import time
from collections import OrderedDict
from collections.abc import AsyncGenerator, AsyncIterator, Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any, NoReturn, TypeVar, cast

import numpy as np
from pydantic import ValidationError
from sqlalchemy import Connection, Engine

from farm import metrics
from farm.config import ProxySettings
from farm.constants import trial_balancer_key
from farm.db import trials
from farm.db.async_trials import AsyncTrials
from farm.errors import InvalidSpec, Unauthorized
from farm.llm.balancer import Balancer
from farm.llm.client import StreamItem
from farm.llm.session import ClientPool, LLMSession
from farm.llm.types import FinishReason, GenerateResult, SamplingParams, StreamDelta, TopLogprobs
from farm.proxy import completion
from farm.proxy.continuity import Continuity, NoCallOpening, Renderer, TemplateFork
from farm.proxy.conversation import ChatRequest, CompletionRequest, Message, Reply, ToolCall, chain, extend
from farm.proxy.text import StopMatcher, TextDecoder
from farm.proxy.toolparse import CallPiece, TextPiece, ToolCallSplitter

log = logging.getLogger(__name__)
T = TypeVar("T")

#: token ids of recent calls kept in memory per process (int32: 4 bytes each).
CACHE_TOKENS = 8_000_000
#: threads for the database, the template and the balancer (asyncio's default pool has cpu + 4: calls would queue).
WORK_THREADS = 64
#: how long a process trusts a key it has checked (an ended trial is still refused: the call's
#: own transaction checks that under the trial's lock).
KEY_CACHE_S = 30.0
#: how often the count of recorded calls goes to Redis (a round trip per call cost as much CPU as
#: the call's own statements).
COUNT_EVERY_S = 1.0


@dataclass(frozen=True)
class TrialContext:
    id: str
    model: str
    sampling: dict[str, Any]


@dataclass(frozen=True)
class Started:
    """The backend has begun answering (the first event of every call)."""

    seq: int
    prompt_tokens: int


@dataclass(frozen=True)
class TextDelta:
    text: str


@dataclass(frozen=True)
class Sampled:
    """Tokens as the backend sampled them, for a streamed call that asked for logprobs: their texts,
    logprobs and (when asked for) their top logprobs as ``(text, logprob)``, most likely first. They
    come before the text they make, which the stop matcher and tool-call parser may still hold back."""

    token_texts: list[str]
    logprobs: list[float]
    top_logprobs: list[list[tuple[str, float]]]


@dataclass(frozen=True)
class ToolCallEvent:
    index: int
    call: ToolCall


@dataclass(frozen=True)
class Usage:
    prompt_tokens: int
    completion_tokens: int
    cached_tokens: int | None = None

    @property
    def total_tokens(self) -> int:
        return self.prompt_tokens + self.completion_tokens


@dataclass(frozen=True)
class Finished:
    reply: Reply
    usage: Usage
    seq: int
    token_ids: list[int]
    logprobs: list[float]
    #: each sampled token's text, for formats that return per-token logprobs.
    token_texts: list[str] = field(default_factory=list)
    #: the prompt's ids, for a format that returns them (``CompletionRequest.prompt_ids``).
    prompt_ids: list[int] = field(default_factory=list)
    #: per sampled token, when the request asked for top logprobs: the most likely tokens' texts and
    #: logprobs, most likely first.
    top_logprobs: list[list[tuple[str, float]]] = field(default_factory=list)


Event = Started | Sampled | TextDelta | ToolCallEvent | Finished


@dataclass
class _Prepared:
    """A call's prompt, before anything is recorded: the backend starts on it while its pending
    row commits (``ProxyCore._record_start``)."""

    prompt_ids: np.ndarray
    #: the ids the call adds to its parent's (all of them without a parent), forced ones included.
    delta: list[int]
    parent: trials.Parent | None
    hashes: list[bytes]
    continuity: Continuity
    #: the end of ``prompt_ids`` that opens a tool call (a tool_choice that demands one): not sampled.
    forced_ids: list[int] = field(default_factory=list)
    #: the request messages the call adds (chat formats; None for a legacy completion).
    messages: list[dict[str, Any]] | None = None
    #: a legacy completion's prompt text (None for its ids, and for every other format).
    prompt_text: str | None = None
    #: a chat call's messages when it starts a segment for no reason found yet: the record explains
    #: it against the trial's latest call (a read that need not delay the backend).
    unexplained: list[Message] | None = None


@dataclass(frozen=True)
class _Started:
    """A call recorded as pending: its seq and start, and the prompt it was started on."""

    seq: int
    started_at: datetime
    prepared: _Prepared


#: a call, for the id cache: its trial, seq and start (a trial deleted and made again under the
#: same id, or reset, numbers its calls from 0 again: its calls are not the old ones).
CallKey = tuple[str, int, datetime | None]


class _IdCache:
    """(trial, seq, start) -> the call's full ids, least recently used out first."""

    def __init__(self, max_tokens: int = CACHE_TOKENS) -> None:
        self.max_tokens = max_tokens
        self._items: OrderedDict[CallKey, np.ndarray] = OrderedDict()
        self._tokens = 0

    def get(self, key: CallKey) -> np.ndarray | None:
        value = self._items.get(key)
        if value is not None:
            self._items.move_to_end(key)
        return value

    def put(self, key: CallKey, ids: np.ndarray) -> None:
        if key in self._items:
            return
        self._items[key] = ids
        self._tokens += len(ids)
        while self._tokens > self.max_tokens and len(self._items) > 1:
            _, old = self._items.popitem(last=False)
            self._tokens -= len(old)


class ProxyCore:
    """Shared by every route of every format in one process.

    ``engine`` records the calls' finishes, durably. ``early_engine`` (owned: ``close`` disposes of
    it) serves the reads and the pending row of a call's start: on PostgreSQL an autocommit engine
    whose commits do not wait for the disk (``farm.db.session.make_autocommit_engine``); None
    means ``engine`` serves them too. ``loop_trials`` (PostgreSQL; owned) runs a call's usual
    statements from the event loop instead (``farm.db.async_trials``); the engines do the rest.
    """

    def __init__(
        self,
        *,
        settings: ProxySettings,
        engine: Engine,
        early_engine: Engine | None,
        balancer: Balancer,
        clients: ClientPool,
        tokenizer: Callable[[], Any],
        served_model: str,
        loop_trials: AsyncTrials | None = None,
    ) -> None:
        self.settings = settings
        self._loop_trials = loop_trials
        self.engine = engine
        self._early_engine = early_engine
        self._early = early_engine or engine
        self.balancer = balancer
        self.clients = clients
        self._tokenizer_loader = tokenizer
        self._renderer: Renderer | None = None
        self.served_model = served_model
        self._ids = _IdCache()
        self._pool = ThreadPoolExecutor(max_workers=WORK_THREADS, thread_name_prefix="proxy")
        self._keys: dict[tuple[str, str], tuple[float, TrialContext]] = {}
        #: calls recorded since the count last went to Redis.
        self._ok_calls = 0
        self._count_due = 0.0

    async def _in_thread(self, fn: Callable[..., T], *args: Any) -> T:
        return await asyncio.get_running_loop().run_in_executor(self._pool, fn, *args)

    def close(self) -> None:
        self._pool.shutdown(wait=False, cancel_futures=True)
        if self._early_engine is not None:
            self._early_engine.dispose()

    async def stop(self) -> None:
        """Close the backend clients and the pools (an app's lifespan ends)."""
        await self.clients.aclose()
        count, self._ok_calls = self._ok_calls, 0
        if count:
            await self._in_thread(metrics.record_proxy_call, self.balancer.redis, "ok", count)
        if self._loop_trials is not None:
            await self._loop_trials.close()
        self.close()

    async def _on_loop(self) -> AsyncTrials | None:
        return await self._loop_trials.here() if self._loop_trials is not None else None

    @property
    def renderer(self) -> Renderer:
        if self._renderer is None:
            self._renderer = Renderer(self._tokenizer_loader())
        return self._renderer

    async def warm(self) -> None:
        """Load the tokenizer off the event loop (it takes seconds the first time)."""
        await self._in_thread(lambda: self.renderer)

    async def open_trial(self, trial_id: str, key: str | None) -> TrialContext:
        """The trial this key opens.

        Raises:
            Unauthorized: no key, or not this trial's key (an unknown trial is refused the same way,
                so a key cannot probe for other trials' ids).
            TrialEnded: the trial has ended.
        """
        if not key:
            raise Unauthorized("no API key: send the trial's key as the API key (Authorization: Bearer or x-api-key)")
        if "\x00" in trial_id:  # no trial has one (a database text cannot hold it)
            raise Unauthorized(f"this key does not open trial {trial_id!r}")

        cached = self._keys.get((trial_id, key))
        if cached is not None and cached[0] > time.monotonic():
            return cached[1]

        def load() -> TrialContext:
            with self._early.connect() as conn:
                found = trials.credentials(conn, trial_id)
            if found is None or not trials.key_matches(found.key_sha256, key):
                raise Unauthorized(f"this key does not open trial {trial_id!r}")
            if found.ended:
                raise trials.TrialEnded(f"trial {trial_id!r} has ended", trial_id=trial_id)
            return TrialContext(id=trial_id, model=found.model, sampling=dict(found.sampling))

        ctx = await self._in_thread(load)
        if len(self._keys) > 100_000:
            self._keys.clear()
        self._keys[(trial_id, key)] = (time.monotonic() + KEY_CACHE_S, ctx)
        return ctx

    async def count_tokens(self, request: ChatRequest) -> int:
        messages = _with_tool_names(request.messages)
        return len(await self._in_thread(self.renderer.fresh, messages, request.tools))

    async def call(
        self,
        trial: TrialContext,
        request: ChatRequest | CompletionRequest,
        *,
        wire: str,
        call_id_prefix: str = "call_",
    ) -> AsyncIterator[Event]:
        """Generate one answer; see the module docstring for the order of events.

        Raises (before the first event, or mid-stream for upstream failures):
            InvalidSpec: the request cannot be served (empty messages...).
            TrialEnded: the trial ended.
            ContextLengthExceeded: the prompt does not fit the model's context.
            UpstreamError: the backend failed; the call is recorded as failed.
        """
        renderer = self._renderer
        if renderer is None:  # loaded once, off the event loop
            renderer = await self._in_thread(lambda: self.renderer)
        sampling = self._sampling(trial, request)
        if isinstance(request, ChatRequest):
            if not request.messages:
                raise InvalidSpec("messages must not be empty", field="messages")
            _check_tool_choice(request)
        llm = LLMSession(
            balancer=self.balancer,
            job_id=trial_balancer_key(trial.id),
            clients=self.clients,
            honour_reject=True,
            executor=self._pool,
        )
        prepared: _Prepared
        db = await self._on_loop()
        try:
            # The call's backend is found on the thread that prepares its prompt, just before.
            if isinstance(request, CompletionRequest):
                prepared = await self._in_thread(_leased, llm, self._prepare_completion, trial, request, wire)
                parse_calls = False
            else:
                messages = _with_tool_names(request.messages)
                hashes = chain(request.tools, messages)
                found = await db.find_parent(trial.id, hashes) if db is not None else _NOT_LOOKED_UP
                prepared = await self._in_thread(_leased, llm, self._prepare, trial, messages, request, hashes, found)
                parse_calls = bool(request.tools) and request.tool_choice != "none"
        except BaseException:
            llm.drop_found()
            raise
        tokenizer = renderer.tokenizer
        stop_ids = set(sampling.stop_token_ids)
        if tokenizer.eos_token_id is not None:
            stop_ids.add(tokenizer.eos_token_id)
        decoder = TextDecoder(tokenizer, hidden_ids=stop_ids)
        stops = StopMatcher(request.sampling.stop)
        splitter = ToolCallSplitter(parse_calls=parse_calls)
        one_call = parse_calls and isinstance(request, ChatRequest) and not request.parallel_tool_calls
        cut_after_call = False
        content: list[str] = []
        calls: list[ToolCall] = []
        # The forced opening of a call is read first: the model's ids continue it.
        forced_text = tokenizer.decode(prepared.forced_ids, skip_special_tokens=False) if prepared.forced_ids else ""
        forced_events = self._pieces(splitter.push(forced_text), content, calls, call_id_prefix)
        sampled: list[int] = []
        logprobs: list[float] = []
        # Returned to the harness, not recorded: a trainer needs the sampled ids' logprobs only.
        tops: list[TopLogprobs] = []
        start = time.perf_counter()
        first_token_s: float | None = None
        yielded = False
        finish: FinishReason | None = None
        stop_string: str | None = None
        backend_id: str | None = None
        cached: int | None = None
        versions: list[tuple[int, int, int]] = []
        # The backend starts on the prompt while the call's pending row commits: nothing of the
        # answer goes out before that commit (a call the harness sees is in the record), and a start
        # that fails (the trial ended meanwhile) closes the backend's request unread.
        recording = asyncio.ensure_future(self._start(db, trial.id, prepared, wire, request.stream))
        started: _Started | None = None
        try:
            # A streamed answer, or one a stop string or its first tool call may cut short (the rest
            # is then aborted), is read from the backend as it is decoded; any other is asked for
            # whole: one answer to parse instead of a chunk per token.
            prompt_ids = prepared.prompt_ids.tolist()
            num_top = request.top_logprobs if request.logprobs else 0
            if request.stream or request.sampling.stop or one_call:
                stream = llm.generate_stream(prompt_ids, sampling, top_logprobs=num_top)
            else:
                stream = _whole(llm, prompt_ids, sampling, num_top)
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
                        started = await recording
                        yield Started(seq=started.seq, prompt_tokens=len(prepared.prompt_ids))
                        for event in forced_events:  # text the template writes before a call's tag
                            yielded = True
                            yield event
                    sampled += item.token_ids
                    logprobs += item.logprobs
                    tops += item.top_logprobs or []
                    if request.stream and request.logprobs:
                        yield _sampled(tokenizer, item)
                    text, stop_string = stops.push(decoder.push(item.token_ids))
                    pieces = splitter.push(text)
                    if one_call:
                        pieces, cut_after_call = _through_first_call(pieces)
                    for event in self._pieces(pieces, content, calls, call_id_prefix):
                        yielded = True
                        yield event
                    if stop_string is not None or cut_after_call:
                        break  # the rest of the answer is not wanted
            if started is None:
                started = await recording
            if cut_after_call:
                # What was sampled past the call stays in the record (the next prompt continues from
                # it); the harness is shown none of it.
                stop_string = None
            else:
                tail, hit = stops.push(decoder.flush(), final=stop_string is None)
                stop_string = stop_string or hit
                for event in self._pieces([*splitter.push(tail), *splitter.finish()], content, calls, call_id_prefix):
                    yielded = True
                    yield event
            if stop_string is not None or cut_after_call:
                finish = FinishReason.STOP
                backend_id = backend_id or llm.backend_id
            if finish is None:
                raise InvalidSpec("the backend's stream ended without a finish reason")
            reply = Reply(
                content="".join(content),
                tool_calls=calls,
                finish_reason="length" if finish is FinishReason.LENGTH else ("tool_calls" if calls else "stop"),
                stop_string=stop_string,
                cut_after_call=cut_after_call,
            )
            unmet = _unmet(request, calls, finish) if isinstance(request, ChatRequest) else None
            record = {
                "sampled_ids": sampled,
                "logprobs": logprobs,
                "backend_id": backend_id,
                "first_token_s": first_token_s,
                "latency_s": time.perf_counter() - start,
                # A stop string cuts the answer short: spans past what was kept are dropped.
                "weight_versions": [(v, s, min(e, len(sampled))) for v, s, e in versions if s < len(sampled)],
                "continuity": {**prepared.continuity.as_dict(), "tool_choice_unmet": unmet} if unmet else None,
            }
            end: Callable[[], tuple[bytes, dict[str, Any]]]
            if isinstance(request, CompletionRequest):
                end = functools.partial(self._completion_end, started, sampled, reply)
            else:
                end = functools.partial(_chat_end, prepared.hashes[-1], reply)
            await self._finish(db, trial.id, started, reply=reply, end=end, **record)
        except BaseException as exc:
            llm.drop_found()
            await asyncio.shield(self._fail_recorded(trial.id, recording, exc, yielded and request.stream))
            if isinstance(exc, (trials.TrialEnded, trials.TrialNotFound)):
                # The trial's end gave its backend slot back; this call took it again on its way.
                with contextlib.suppress(Exception):
                    await asyncio.shield(llm.close())
            raise
        texts: list[str] = []
        top_texts: list[list[tuple[str, float]]] = []
        if request.logprobs:
            # Each distinct id decoded once: k top tokens per position repeat a lot.
            wanted = set(sampled).union(*(top.keys() for top in tops))
            decoded = {t: tokenizer.decode([t], skip_special_tokens=False) for t in wanted}
            texts = [decoded[t] for t in sampled]
            top_texts = [[(decoded[t], lp) for t, lp in top.items()] for top in tops[: len(sampled)]]
        yield Finished(
            reply=reply,
            usage=Usage(prompt_tokens=len(prepared.prompt_ids), completion_tokens=len(sampled), cached_tokens=cached),
            seq=started.seq,
            token_ids=sampled,
            logprobs=logprobs,
            token_texts=texts,
            prompt_ids=prompt_ids if isinstance(request, CompletionRequest) and request.prompt_ids else [],
            top_logprobs=top_texts,
        )

    def _pieces(
        self, pieces: list[TextPiece | CallPiece], content: list[str], calls: list[ToolCall], id_prefix: str
    ) -> list[Event]:
        events: list[Event] = []
        for piece in pieces:
            if isinstance(piece, TextPiece):
                content.append(piece.text)
                events.append(TextDelta(piece.text))
            else:
                call = ToolCall(id=f"{id_prefix}{secrets.token_hex(12)}", name=piece.name, arguments=piece.arguments)
                events.append(ToolCallEvent(index=len(calls), call=call))
                calls.append(call)
        return events

    def _sampling(self, trial: TrialContext, request: ChatRequest | CompletionRequest) -> SamplingParams:
        asked = request.sampling
        values: dict[str, Any] = {"max_tokens": asked.max_tokens or self.settings.default_max_tokens}
        for name in ("temperature", "top_p", "top_k", "seed"):
            if getattr(asked, name) is not None:
                values[name] = getattr(asked, name)
        values.update(trial.sampling)  # the trainer's settings win over the harness's
        try:
            return SamplingParams(**values)
        except ValidationError as exc:
            # Name the parameter (max_tokens past the limit...), not pydantic's whole dump.
            first = exc.errors()[0]
            name = ".".join(str(p) for p in first["loc"]) or "sampling"
            if name == "max_tokens" and "max_tokens" not in trial.sampling:
                name = asked.max_tokens_field
            raise InvalidSpec(f"{name}: {first['msg']}", field=name) from exc
        except ValueError as exc:
            raise InvalidSpec(f"invalid sampling parameters: {exc}", field="sampling") from exc

    def _prepare(
        self,
        trial: TrialContext,
        messages: list[Message],
        request: ChatRequest,
        hashes: list[bytes],
        found: trials.Parent | None | _NotLookedUp,
    ) -> _Prepared:
        """The call's prompt: its parent's ids and the template's delta for the new messages when
        the request extends an earlier call, else the whole history rendered (a new segment).
        ``found``: the parent, when the event loop looked it up."""
        renderer = self.renderer
        if isinstance(found, _NotLookedUp):
            with self._early.connect() as conn:
                found = trials.find_parent(conn, trial.id, hashes)
        parent = found
        continuity = Continuity()
        prompt: np.ndarray | None = None
        delta: list[int] = []
        if parent is not None:
            parent_ids = self._ids.get((trial.id, parent.seq, parent.started_at))
            if parent_ids is None:
                with self._early.connect() as conn:
                    parent_ids = trials.end_ids(conn, trial.id, parent.seq)
            try:
                delta = renderer.delta(
                    messages,
                    request.tools,
                    covered=parent.covered,
                    last_sampled_id=parent.last_sampled_id,
                )
            except TemplateFork as exc:
                continuity.reason, continuity.diverged_at, continuity.compared_with = (
                    str(exc),
                    parent.covered,
                    parent.seq,
                )
                parent = None
            else:
                prompt = np.concatenate([parent_ids, np.asarray(delta, dtype=np.int32)])
                continuity.extends = parent.seq
                continuity.reused_tokens, continuity.template_tokens = len(parent_ids), len(delta)
        unexplained: list[Message] | None = None
        if prompt is None:
            delta = renderer.fresh(messages, request.tools)
            prompt = np.asarray(delta, dtype=np.int32)
            unexplained = messages if continuity.reason is None else None
        forced = self._force_call(renderer, messages, request, continuity)
        if forced:
            prompt = np.concatenate([prompt, np.asarray(forced, dtype=np.int32)])
            delta = [*delta, *forced]
        added = messages[parent.covered :] if parent is not None else messages
        return _Prepared(
            prompt_ids=prompt,
            delta=delta,
            parent=parent,
            hashes=hashes,
            continuity=continuity,
            forced_ids=forced,
            messages=[m.for_template() for m in added],
            unexplained=unexplained,
        )

    async def _start(
        self, db: AsyncTrials | None, trial_id: str, prepared: _Prepared, wire: str, streamed: bool
    ) -> _Started:
        """``_record_start``, from the event loop when it can (a new segment to explain cannot).

        Raises:
            TrialNotFound, TrialEnded.
        """
        if db is None or prepared.unexplained is not None:
            return await self._in_thread(self._record_start, trial_id, prepared, wire, streamed)
        started_at = datetime.now(UTC)
        seq = await db.add_call(trial_id, started_at=started_at, **_pending(prepared, wire, streamed))
        if seq is None:
            await self._in_thread(self._raise_closed, trial_id)
            raise AssertionError("unreachable: the trial was not open")
        return _Started(seq=seq, started_at=started_at, prepared=prepared)

    def _raise_closed(self, trial_id: str) -> NoReturn:
        with self._early.connect() as conn:
            trials.raise_closed(conn, trial_id)

    def _record_start(self, trial_id: str, prepared: _Prepared, wire: str, streamed: bool) -> _Started:
        """Record the call as pending; its seq.

        The pending row's commit does not wait for the disk (``early_engine``): a database crash may
        lose it; the call's own finish then finds no pending row and fails the call (the harness gets
        an error, never an answer the record lacks), and every finish waits for the disk, carrying
        the earlier writes with it (the WAL is written in order).

        Raises:
            TrialNotFound, TrialEnded.
        """
        continuity = prepared.continuity
        with self._early.connect() as conn:
            if prepared.unexplained is not None:
                _explain_new_segment(conn, trial_id, prepared.hashes, prepared.unexplained, continuity)
            started_at = datetime.now(UTC)
            seq = trials.add_call(conn, trial_id, started_at=started_at, **_pending(prepared, wire, streamed))
            conn.commit()
        return _Started(seq=seq, started_at=started_at, prepared=prepared)

    async def _fail_recorded(
        self, trial_id: str, recording: asyncio.Future[_Started], exc: BaseException, seen: bool
    ) -> None:
        """Record a call's failure once its start is recorded (none to record if its start failed)."""
        try:
            started = await recording
        except BaseException:  # noqa: BLE001 - the start's own failure is the one being raised
            return
        await self._in_thread(self._fail, trial_id, started.seq, exc, seen)

    @staticmethod
    def _force_call(
        renderer: Renderer, messages: list[Message], request: ChatRequest, continuity: Continuity
    ) -> list[int]:
        """The ids that open a tool call, for a tool_choice that demands one (none otherwise)."""
        choice = request.tool_choice
        if choice in ("auto", "none"):
            return []
        name: str | None = choice
        if choice == "required":
            # With one tool, "required" can only mean that tool: its name is forced too.
            name = request.tools[0].name if len(request.tools) == 1 else None
        try:
            forced = renderer.call_opening(messages, request.tools, name=name)
        except NoCallOpening as exc:
            continuity.notes.append(f"tool_choice={choice} not enforced: {exc}")
            return []
        continuity.forced_prefix_tokens = len(forced)
        continuity.forced_prefix_reason = f"tool_choice={choice}"
        return forced

    def _completion_end(self, started: _Started, sampled: list[int], reply: Reply) -> tuple[bytes, dict[str, Any]]:
        """A legacy completion's end keys: the hash of its ids, and for a text prompt its text keys."""
        prepared = started.prepared
        ids = np.concatenate([prepared.prompt_ids, np.asarray(sampled, dtype=np.int32)])
        extra: dict[str, Any] = {"text_keys": None}
        if prepared.prompt_text is not None:
            sampled_text = str(self.renderer.tokenizer.decode(sampled, skip_special_tokens=False))
            extra["text_keys"] = completion.text_keys(prepared.prompt_text, sampled_text, reply.content)
        return completion.ids_hash(ids), extra

    def _prepare_completion(self, trial: TrialContext, request: CompletionRequest, wire: str) -> _Prepared:
        """A legacy completion's prompt ids (no template: see ``farm.proxy.completion``).

        Raises:
            InvalidSpec: an empty prompt, or ids outside the vocabulary.
        """
        renderer = self.renderer
        given = request.prompt
        if not given:
            raise InvalidSpec("prompt must not be empty", field="prompt")
        if not isinstance(given, str):
            vocab = len(cast(Any, renderer.tokenizer))  # Hugging Face tokenizers: the vocabulary with added tokens
            bad = next((t for t in given if not 0 <= t < vocab), None)
            if bad is not None:
                raise InvalidSpec(f"prompt holds the id {bad}, outside the vocabulary (0..{vocab - 1})", field="prompt")
        with self._early.connect() as conn:
            ends = trials.completion_ends(conn, trial.id, wire)
            match = completion.find(ends, given if isinstance(given, str) else np.asarray(given, dtype=np.int32))
            continuity = Continuity()
            parent: trials.Parent | None = None
            if match.parent is not None:
                end = match.parent
                parent = trials.Parent(
                    seq=end.seq,
                    segment=end.segment,
                    covered=0,
                    last_sampled_id=None,
                )
                if isinstance(given, str):
                    parent_ids = self._ids.get((trial.id, end.seq, end.started_at))
                    if parent_ids is None:
                        parent_ids = trials.end_ids(conn, trial.id, end.seq)
                    delta = renderer.encode(given[match.covered :]) if match.covered < len(given) else []
                    prompt = np.concatenate([parent_ids, np.asarray(delta, dtype=np.int32)])
                else:
                    delta = list(given[match.covered :])
                    prompt = np.asarray(given, dtype=np.int32)
                continuity.extends = end.seq
                continuity.reused_tokens, continuity.template_tokens = end.end_tokens, len(delta)
            else:
                delta = renderer.encode(given) if isinstance(given, str) else list(given)
                prompt = np.asarray(delta, dtype=np.int32)
                continuity.compared_with = match.compared_with
                continuity.reason = match.reason
                if continuity.reason is None:
                    earlier = trials.latest_hashes(conn, trial.id)
                    continuity.reason = "first call" if earlier is None else "the trial's first completion call"
                    continuity.compared_with = earlier[0] if earlier is not None else None
        return _Prepared(
            prompt_ids=prompt,
            delta=delta,
            parent=parent,
            hashes=[completion.ids_hash(prompt)],
            continuity=continuity,
            prompt_text=given if isinstance(given, str) else None,
        )

    async def _finish(
        self,
        db: AsyncTrials | None,
        trial_id: str,
        started: _Started,
        *,
        reply: Reply,
        end: Callable[[], tuple[bytes, dict[str, Any]]],
        **record: Any,
    ) -> None:
        """Record the call's answer, durably. ``end``: the call's end hash and what its reply's
        record adds to the reply.

        Raises:
            TrialEnded: the call was no longer pending (its trial ended).
        """
        parent = started.prepared.parent
        parent_seq = parent.seq if parent is not None else None

        def values() -> dict[str, Any]:
            end_hash, extra = end()
            reply_record = {**reply.model_dump(mode="json"), **extra}
            return {"finish_reason": reply.finish_reason, "reply": reply_record, "end_hash": end_hash, **record}

        def finish(known: dict[str, Any]) -> bool:
            with self.engine.begin() as conn:
                return trials.finish_call(conn, trial_id, started.seq, parent_seq=parent_seq, **known)

        if db is None:  # the values too are computed off the event loop
            done = await self._in_thread(lambda: finish(values()))
        else:
            known = values()
            done = await db.finish_call(trial_id, started.seq, **known)
            if not done:  # a branch, or no longer pending: the sync finish tells which
                done = await self._in_thread(finish, known)
        if not done:
            raise trials.TrialEnded(f"trial {trial_id!r} ended while call {started.seq} was generating")
        self._count_ok()
        ids = np.concatenate([started.prepared.prompt_ids, np.asarray(record["sampled_ids"], dtype=np.int32)])
        self._ids.put((trial_id, started.seq, started.started_at), ids)

    def _count_ok(self) -> None:
        """One more recorded call (on the event loop); Redis hears of them within COUNT_EVERY_S."""
        self._ok_calls += 1
        now = time.monotonic()
        # A send is due once per count; one overdue (its loop ended: a test client's) is made again.
        if self._ok_calls == 1 or now > self._count_due + COUNT_EVERY_S:
            self._count_due = now + COUNT_EVERY_S
            asyncio.get_running_loop().call_later(COUNT_EVERY_S, self._send_count)

    def _send_count(self) -> None:
        """On the event loop: the count so far goes to Redis from a thread."""
        count, self._ok_calls = self._ok_calls, 0
        if count:
            self._pool.submit(metrics.record_proxy_call, self.balancer.redis, "ok", count)

    def _fail(self, trial_id: str, seq: int, exc: BaseException, seen: bool) -> None:
        metrics.record_proxy_call(self.balancer.redis, "failed")
        if isinstance(exc, asyncio.CancelledError):
            error = "cancelled: the harness closed its connection (or the proxy stopped) before the answer"
        else:
            error = f"{type(exc).__name__}: {exc}"
        try:
            with self.engine.begin() as conn:
                trials.fail_call(conn, trial_id, seq, error, seen=seen)
        except Exception:  # the database is what failed: the pending row says the outcome is unknown
            log.exception("could not record the failure of call %s of trial %s", seq, trial_id)


class _NotLookedUp:
    """The event loop did not look up the call's parent: the thread preparing the call does."""


_NOT_LOOKED_UP = _NotLookedUp()


def _pending(prepared: _Prepared, wire: str, streamed: bool) -> dict[str, Any]:
    """What ``trials.add_call`` records of a call's start (but its start time)."""
    return {
        "parent": prepared.parent,
        "wire": wire,
        "streamed": streamed,
        "message_hashes": prepared.hashes,
        "delta_ids": prepared.delta,
        "prompt_tokens": len(prepared.prompt_ids),
        "continuity": prepared.continuity.as_dict(),
        "messages": prepared.messages,
    }


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


def _chat_end(last_hash: bytes, reply: Reply) -> tuple[bytes, dict[str, Any]]:
    return extend(last_hash, reply.message()), {}


def _explain_new_segment(
    conn: Connection, trial_id: str, hashes: list[bytes], messages: list[Message], continuity: Continuity
) -> None:
    latest = trials.latest_hashes(conn, trial_id)
    if latest is None:
        continuity.reason = "first call"
        return
    seq, previous = latest
    continuity.compared_with = seq
    same = 0
    while same < min(len(previous), len(hashes)) and previous[same] == hashes[same]:
        same += 1
    continuity.diverged_at = same
    if same == len(hashes):
        if same == len(previous) - 1:
            continuity.reason = f"repeats call {seq}'s request (a retry, or another sample of it)"
        else:
            continuity.reason = f"the history is shorter than call {seq}'s (compaction or dropped messages)"
    elif same == len(previous) - 1 and messages[same].role == "assistant":
        continuity.reason = f"message {same} is not the reply call {seq} gave (the harness changed it)"
    elif same == len(previous) - 1:
        role = messages[same].role
        continuity.reason = f"the harness dropped call {seq}'s reply (message {same} is a {role} message)"
    else:
        role = messages[same].role
        continuity.reason = (
            f"message {same} ({role}) differs from call {seq}'s history (edited, dropped, or another conversation)"
        )


def _leased(llm: LLMSession, prepare: Callable[..., _Prepared], *args: Any) -> _Prepared:
    """``prepare(*args)``, the call's backend found first on the same thread."""
    llm.acquire_here()
    return prepare(*args)


def _through_first_call(pieces: list[TextPiece | CallPiece]) -> tuple[list[TextPiece | CallPiece], bool]:
    """The pieces up to and including the first call, and whether there was one."""
    for i, piece in enumerate(pieces):
        if isinstance(piece, CallPiece):
            return pieces[: i + 1], True
    return pieces, False


def _check_tool_choice(request: ChatRequest) -> None:
    """Raises InvalidSpec: a tool_choice that cannot be met by any of the request's tools."""
    choice = request.tool_choice
    if choice in ("auto", "none"):
        return
    names = [t.name for t in request.tools]
    if not names:
        # Not the choice's value: each format spells it its own way (Anthropic's any is required here).
        raise InvalidSpec("tool_choice demands a tool call, but the request offers no tools", field="tool_choice")
    if choice != "required" and choice not in names:
        raise InvalidSpec(f"tool_choice names {choice!r}, which is not among the tools {names}", field="tool_choice")


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


def _with_tool_names(messages: list[Message]) -> list[Message]:
    names = {call.id: call.name for m in messages for call in m.tool_calls}
    out = []
    for m in messages:
        if m.role == "tool" and m.name is None and m.tool_call_id in names:
            m = m.model_copy(update={"name": names[m.tool_call_id]})
        out.append(m)
    return out
