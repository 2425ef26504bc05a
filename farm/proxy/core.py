"""The proxy's one path for every wire format: authenticate, prepare, generate, record, answer.

``ProxyCore.call`` reads forward: the call's prompt is prepared (``farm.proxy.prepare``), the
backend starts on it while its pending row commits, the sampled ids become events
(``farm.proxy.generate``), and the answer is recorded (``farm.proxy.recording``, through a
``farm.trials.recorder.CallRecorder``). It is an async iterator of events: text deltas and tool
calls as the model writes them, then ``Finished``. ``Finished`` is yielded only after the call's
record (prompt ids, sampled ids, logprobs, the reply given) is committed, so a format adapter that
sends its final chunk on ``Finished`` never shows a harness an answer the record lacks.

State lives in PostgreSQL (the record) and Redis (the balancer's sticky backend per trial), so any
proxy process serves any trial. A process keeps the ids of recent calls in memory; another process
rebuilds them from the record.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import threading
import time
from collections.abc import AsyncIterator, Callable
from concurrent.futures import Executor
from dataclasses import dataclass
from datetime import datetime
from typing import Any, TypeVar

import numpy as np

from farm import metrics, signals
from farm.config import ProxySettings
from farm.constants import trial_balancer_key
from farm.errors import TrialEnded, TrialNotFound, Unauthorized
from farm.llm.balancer import Balancer
from farm.llm.session import ClientPool, LLMSession
from farm.proxy import bounds, parsers
from farm.proxy.continuity import Renderer
from farm.proxy.conversation import ChatRequest, CompletionRequest, chain
from farm.proxy.events import Event, Finished, TrialContext
from farm.proxy.generate import Generated, Generation
from farm.proxy.parsers import ParserNames
from farm.proxy.prepare import IdCache, Prepared, Preparer, check_chat, sampling_params, with_tool_names
from farm.proxy.reasoning_formats import PROMPT_TAIL_IDS
from farm.proxy.recording import call_finish, call_start
from farm.trials import statements, store
from farm.trials.recorder import CallRecorder

log = logging.getLogger(__name__)
T = TypeVar("T")

#: how long a process trusts a key it has checked (an ended trial is still refused: the call's
#: own transaction checks that under the trial's lock).
KEY_CACHE_S = 30.0
#: how often the count of recorded calls goes to Redis (a round trip per call cost as much CPU as
#: the call's own statements).
COUNT_EVERY_S = 1.0
#: renderers kept for distinct per-request template kwargs (the oldest goes first).
MAX_KWARG_RENDERERS = 32


@dataclass(frozen=True)
class _Begun:
    """A call recorded as pending: its seq and start, and the prompt it was started on."""

    seq: int
    started_at: datetime
    prepared: Prepared


class ProxyCore:
    """Shared by every route of every format in one process.

    ``recorder`` records the calls (owned: ``stop`` closes it). ``executor`` runs what blocks: the
    template, the balancer, the recorder's threads (asyncio's default pool has cpu + 4 threads:
    calls would queue); owned too.
    """

    def __init__(
        self,
        *,
        settings: ProxySettings,
        recorder: CallRecorder,
        executor: Executor,
        balancer: Balancer,
        clients: ClientPool,
        tokenizer: Callable[[], Any],
        served_model: str,
    ) -> None:
        self.settings = settings
        self.recorder = recorder
        self.balancer = balancer
        self.clients = clients
        self._tokenizer_loader = tokenizer
        self._renderer: Renderer | None = None
        self._kwarg_renderers: dict[str, Renderer] = {}
        self._loading = threading.Lock()
        self._longest_token = 1
        self._parsers: ParserNames | None = None
        self.served_model = served_model
        self._ids = IdCache()
        self._preparer = Preparer(recorder=recorder, ids=self._ids)
        self._pool = executor
        self._keys: dict[tuple[str, str], tuple[float, TrialContext]] = {}
        #: calls recorded since the count last went to Redis, and their latency and tokens.
        self._ok_calls = 0
        self._tally = signals.Tally()
        self._count_due = 0.0

    async def _in_thread(self, fn: Callable[..., T], *args: Any) -> T:
        return await asyncio.get_running_loop().run_in_executor(self._pool, fn, *args)

    async def stop(self) -> None:
        """Close the backend clients, the recorder and the threads (an app's lifespan ends)."""
        await self.clients.aclose()
        count, self._ok_calls = self._ok_calls, 0
        if count:
            await self._in_thread(metrics.record_proxy_call, self.balancer.redis, "ok", count)
        tally, self._tally = self._tally, signals.Tally()
        await self._in_thread(tally.send, self.balancer.redis)
        await self.recorder.close()
        self._pool.shutdown(wait=False, cancel_futures=True)

    @property
    def renderer(self) -> Renderer:
        """The served model's tokenizer and template; its parsers are chosen as it loads.

        Raises:
            ConfigError: the settings name a family or parser that does not exist.
        """
        if self._renderer is None:
            # Once, under a lock: threads importing transformers at the same time see it half
            # imported (ImportError: cannot import name 'AutoTokenizer').
            with self._loading:
                if self._renderer is None:
                    tokenizer = self._tokenizer_loader()
                    self._longest_token = bounds.longest_token_bytes(tokenizer)
                    renderer = Renderer(tokenizer, bound=bounds.prompt_bound(self._longest_token, self.settings))
                    template = getattr(renderer.tokenizer, "chat_template", None)
                    self._parsers = parsers.choose(self.settings, template)
                    self._renderer = renderer
        return self._renderer

    def _renderer_with(self, base: Renderer, kwargs: dict[str, Any]) -> Renderer:
        """The renderer for these template kwargs (a few distinct ones in practice; kept, bounded)."""
        key = json.dumps(kwargs, sort_keys=True)
        renderer = self._kwarg_renderers.get(key)
        if renderer is None:
            if len(self._kwarg_renderers) >= MAX_KWARG_RENDERERS:
                self._kwarg_renderers.pop(next(iter(self._kwarg_renderers)))
            renderer = self._kwarg_renderers[key] = Renderer(base.tokenizer, template_kwargs=kwargs, bound=base.bound)
        return renderer

    async def longest_token_bytes(self) -> int:
        """The most bytes of text one token of the served model stands for (``farm.proxy.bounds``)."""
        if self._renderer is None:
            await self.warm()
        return self._longest_token

    @property
    def parser_names(self) -> ParserNames:
        """The parsers that read the served model's answers (``farm.proxy.parsers.choose``)."""
        if self._parsers is None:
            _ = self.renderer
        assert self._parsers is not None
        return self._parsers

    async def warm(self) -> None:
        """Load the tokenizer off the event loop (it takes seconds the first time)."""
        await self._in_thread(lambda: self.renderer)

    async def open_trial(self, trial_id: str, key: str | None, *, cached: bool = True) -> TrialContext:
        """The trial this key opens (``cached=False``: read now, for a route that records nothing
        that would find the trial ended).

        Raises:
            Unauthorized: no key, or not this trial's key (an unknown trial is refused the same way,
                so a key cannot probe for other trials' ids).
            TrialEnded: the trial has ended.
        """
        if not key:
            raise Unauthorized("no API key: send the trial's key as the API key (Authorization: Bearer or x-api-key)")
        if "\x00" in trial_id:  # no trial has one (a database text cannot hold it)
            raise Unauthorized(f"this key does not open trial {trial_id!r}")

        found_key = self._keys.get((trial_id, key))
        if found_key is not None and found_key[0] > time.monotonic() and cached:
            return found_key[1]

        def load() -> TrialContext:
            with self.recorder.reading() as conn:
                found = statements.credentials(conn, trial_id)
            if found is None or not store.key_matches(found.key_sha256, key):
                raise Unauthorized(f"this key does not open trial {trial_id!r}")
            if found.ended:
                raise TrialEnded(f"trial {trial_id!r} has ended", trial_id=trial_id)
            return TrialContext(id=trial_id, model=found.model, sampling=dict(found.sampling), history=found.history)

        ctx = await self._in_thread(load)
        if len(self._keys) > 100_000:
            self._keys.clear()
        self._keys[(trial_id, key)] = (time.monotonic() + KEY_CACHE_S, ctx)
        return ctx

    async def count_tokens(self, request: ChatRequest) -> int:
        messages = with_tool_names(request.messages)
        return len(await self._in_thread(self.renderer.fresh, messages, request.tools))

    async def call(
        self,
        trial: TrialContext,
        request: ChatRequest | CompletionRequest,
        *,
        wire: str,
        call_id_prefix: str = "call_",
        build: Callable[[Finished], None] | None = None,
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
        if isinstance(request, ChatRequest) and request.template_kwargs:
            renderer = self._renderer_with(renderer, request.template_kwargs)
        sampling = sampling_params(trial, request, default_max_tokens=self.settings.default_max_tokens)
        if isinstance(request, ChatRequest):
            check_chat(request)
        arrived = time.monotonic()
        llm = LLMSession(
            balancer=self.balancer,
            job_id=trial_balancer_key(trial.id),
            clients=self.clients,
            honour_reject=True,
            executor=self._pool,
        )
        prepared = await self._prepare(llm, renderer, trial, request, wire)
        # The prompt's last ids say whether the template closed the reasoning before the answer.
        prompt_tail = ""
        if self.parser_names.reasoning != "none":
            prompt_tail = renderer.tokenizer.decode(prepared.prompt_ids[-PROMPT_TAIL_IDS:].tolist())
        generation = Generation(
            tokenizer=renderer.tokenizer,
            request=request,
            sampling=sampling,
            parsers=self.parser_names,
            forced_ids=prepared.forced_ids,
            call_id_prefix=call_id_prefix,
            prompt_tail=prompt_tail,
            end_ids=renderer.end_ids,
        )
        prompt_ids = prepared.prompt_ids.tolist()
        # The backend starts on the prompt while the call's pending row commits: nothing of the
        # answer goes out before that commit, and a start that fails (the trial ended meanwhile)
        # closes the backend's request unread.
        recording = asyncio.ensure_future(self._record_start(trial.id, prepared, wire, request.stream))

        async def started() -> int:
            return (await recording).seq

        try:
            async for event in generation.events(llm, prompt_ids, started):
                yield event
            begun = await recording
            done = generation.finished(begun.seq, prompt_ids)
            if build is not None:
                build(done)  # a whole answer is recorded done only once it is built
            await self._record_finish(trial.id, begun, generation.generated)
            self._tally.observe("farm_proxy_call_seconds", time.monotonic() - arrived)
            self._tally.merge(llm.tokens)
        except BaseException as exc:
            llm.drop_found()
            await asyncio.shield(self._record_failure(trial.id, recording, exc, generation.yielded and request.stream))
            if isinstance(exc, (TrialEnded, TrialNotFound)):
                # The trial's end gave its backend slot back; this call took it again on its way.
                with contextlib.suppress(Exception):
                    await asyncio.shield(llm.close())
            raise
        yield done

    async def _prepare(
        self,
        llm: LLMSession,
        renderer: Renderer,
        trial: TrialContext,
        request: ChatRequest | CompletionRequest,
        wire: str,
    ) -> Prepared:
        """The call's prompt, on a thread that first finds the call's backend (its lease is dropped
        if preparing fails)."""
        try:
            if isinstance(request, CompletionRequest):
                return await self._in_thread(_leased, llm, self._preparer.completion, renderer, trial, request, wire)
            messages = with_tool_names(request.messages)
            hashes = chain(request.tools, messages, request.template_kwargs)
            parent = await self.recorder.find_parent(trial.id, hashes)
            return await self._in_thread(
                _leased, llm, self._preparer.chat, renderer, trial, messages, request, hashes, parent
            )
        except BaseException:
            llm.drop_found()
            raise

    async def _record_start(self, trial_id: str, prepared: Prepared, wire: str, streamed: bool) -> _Begun:
        """Record the call as pending (``farm.trials.recorder`` says what a crash may lose).

        Raises:
            TrialNotFound, TrialEnded.
        """
        start = call_start(prepared, wire=wire, streamed=streamed)
        seq = await self.recorder.start(trial_id, start, explain=prepared.explain())
        return _Begun(seq=seq, started_at=start.started_at, prepared=prepared)

    async def _record_finish(self, trial_id: str, begun: _Begun, generated: Generated) -> None:
        """Record the call's answer, durably.

        Raises:
            TrialEnded: the call was no longer pending (its trial ended).
        """
        prepared = begun.prepared
        tokenizer = self.renderer.tokenizer
        parent_seq = prepared.parent.seq if prepared.parent is not None else None
        done = await self.recorder.finish(
            trial_id, begun.seq, lambda: call_finish(prepared, generated, tokenizer=tokenizer), parent_seq=parent_seq
        )
        if not done:
            raise TrialEnded(f"trial {trial_id!r} ended while call {begun.seq} was generating")
        self._count_ok()
        ids = np.concatenate([prepared.prompt_ids, np.asarray(generated.sampled, dtype=np.int32)])
        self._ids.put((trial_id, begun.seq, begun.started_at), ids)

    async def _record_failure(
        self, trial_id: str, recording: asyncio.Future[_Begun], exc: BaseException, seen: bool
    ) -> None:
        """Record a call's failure once its start is recorded (none to record if its start failed)."""
        try:
            begun = await recording
        except BaseException:  # noqa: BLE001 - the start's own failure is the one being raised
            return
        await self._in_thread(metrics.record_proxy_call, self.balancer.redis, "failed")
        if isinstance(exc, asyncio.CancelledError):
            error = "cancelled: the harness closed its connection (or the proxy stopped) before the answer"
        else:
            error = f"{type(exc).__name__}: {exc}"
        await self.recorder.fail(trial_id, begun.seq, error, seen=seen)

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
        tally, self._tally = self._tally, signals.Tally()
        if not tally.empty():
            self._pool.submit(tally.send, self.balancer.redis)


def _leased(llm: LLMSession, prepare: Callable[..., Prepared], *args: Any) -> Prepared:
    """``prepare(*args)``, the call's backend found first on the same thread."""
    llm.acquire_here()
    return prepare(*args)
