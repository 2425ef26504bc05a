"""One job's conversation with the LLM: sticky backend from the balancer, re-routed when that backend dies.

Usage by the agent loop::

    async with LLMSession(balancer=balancer, job_id=job_id, clients=pool) as llm:
        result = await llm.generate(prompt_ids, sampling)
    # llm.moves lists (from, to) for every re-route; the slot is released on exit, failure and cancel alike
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncGenerator, Awaitable, Callable
from concurrent.futures import Executor
from typing import Any, TypeVar

import httpx

from farm import signals
from farm.config import LLMSettings
from farm.errors import BackendsPaused, Cancelled, NoBackendAvailable, UpstreamConnectError, UpstreamError
from farm.llm.balancer import Balancer, Lease
from farm.llm.client import BackendClient, StreamItem, make_client
from farm.llm.types import FinishReason, GenerateRequest, GenerateResult, SamplingParams, StreamDelta, TopLogprobs

T = TypeVar("T")

#: backends a single turn may try when the ones it is given cannot be reached.
DEFAULT_MAX_REROUTES = 3
#: how often a turn held by a weight update checks whether the farm has resumed.
PAUSE_POLL_S = 0.1
#: times a turn is sent again after its backend aborted it while the farm was not paused (an
#: operator's ``/abort_requests``); one aborted by a weight update is sent again once resumed.
MAX_UNPAUSED_ABORTS = 2


class ClientPool:
    """One pooled client per backend, shared by every session of a process (keep-alive connections)."""

    def __init__(self, *, transport: httpx.AsyncBaseTransport | None = None, **client_kwargs: Any) -> None:
        self._transport = transport
        self._kwargs = client_kwargs
        self._clients: dict[tuple[str, str], BackendClient] = {}

    @classmethod
    def from_settings(cls, settings: LLMSettings, *, transport: httpx.AsyncBaseTransport | None = None) -> ClientPool:
        return cls(
            transport=transport,
            timeout_s=settings.request_timeout_s,
            connect_timeout_s=settings.connect_timeout_s,
            connect_retries=settings.connect_retries,
            api=settings.vllm_api,
        )

    def get(self, lease: Lease) -> BackendClient:
        key = (lease.backend_id, lease.url)
        if key not in self._clients:
            self._clients[key] = make_client(
                kind=lease.kind,
                base_url=lease.url,
                backend_id=lease.backend_id,
                model=lease.model,
                transport=self._transport,
                **self._kwargs,
            )
        return self._clients[key]

    async def aclose(self) -> None:
        clients, self._clients = list(self._clients.values()), {}
        for client in clients:
            await client.aclose()


class LLMSession:
    """A job's sticky link to one backend. ``generate`` per turn, ``close`` (or ``async with``) at the end."""

    def __init__(
        self,
        *,
        balancer: Balancer,
        job_id: str,
        clients: ClientPool,
        max_reroutes: int = DEFAULT_MAX_REROUTES,
        honour_reject: bool = False,
        backend_wait_s: float = 0.0,
        executor: Executor | None = None,
        count_tokens: bool = False,
    ) -> None:
        self.balancer = balancer
        #: threads for the balancer's Redis calls (None: the event loop's default pool, which has
        #: cpu + 4 threads: a process making many calls at once wants its own, bigger pool).
        self.executor = executor
        #: how long a turn waits for a healthy backend to be registered or re-admitted before it
        #: raises NoBackendAvailable (0: at once).
        self.backend_wait_s = backend_wait_s
        #: raise BackendsPaused, instead of waiting, while a weight update asks calls to be rejected
        #: (the proxy's harness calls; the built-in loop always waits).
        self.honour_reject = honour_reject
        self.job_id = job_id
        self.clients = clients
        self.max_reroutes = max_reroutes
        #: (from_backend, to_backend) for every time this job was moved off a dead backend.
        self.moves: list[tuple[str, str]] = []
        self.backend_id: str | None = None
        #: turns a backend aborted (a weight update in mode abort) and this session sent again.
        self.aborted_turns = 0
        #: seconds turns waited for a weight update to end.
        self.paused_s = 0.0
        #: the backend found for the next turn by the caller's own thread (``acquire_here``).
        self._found: Lease | None = None
        #: the tokens each backend read and sampled for this session's turns (``farm.signals``);
        #: sent to Redis at ``close`` when ``count_tokens``, else the caller sends them.
        self.tokens = signals.Tally()
        self.count_tokens = count_tokens

    def acquire_here(self) -> None:
        """Find the job's backend for the next turn on the calling thread (the balancer's call
        blocks): a caller that prepares its turn on a thread of its own finds the backend in that
        same hop, with no thread and no wait for the GIL of its own (measured with the proxy: ~0.5 ms
        of CPU less per call than a hop of its own). A lease that cannot serve at once (the farm
        paused, no backend, Redis failing) is not kept: the turn finds its backend as usual, with
        the waits and errors that go with it. ``drop_found`` when no turn follows."""
        if self._found is not None:
            return
        try:
            lease = self.balancer.acquire(self.job_id)
        except Exception:  # noqa: BLE001 - the turn's own acquire meets it again and raises it
            return
        if lease.paused is None:
            self._found = lease

    def drop_found(self) -> None:
        """Forget the backend ``acquire_here`` found (its slot stays the job's until ``close``)."""
        self._found = None

    async def _blocking(self, fn: Callable[..., T], *args: Any) -> T:
        return await asyncio.get_running_loop().run_in_executor(self.executor, fn, *args)

    async def _lease(self) -> Lease:
        found, self._found = self._found, None
        return self._took(found) if found is not None else await self._acquire()

    def _took(self, lease: Lease) -> Lease:
        if lease.moved_from is not None:
            self.moves.append((lease.moved_from, lease.backend_id))
        self.backend_id = lease.backend_id
        return lease

    async def __aenter__(self) -> LLMSession:
        return self

    async def __aexit__(self, *_: object) -> None:
        await self.close()

    async def generate(
        self, prompt_ids: list[int], sampling: SamplingParams | None = None, *, top_logprobs: int = 0
    ) -> GenerateResult:
        """One turn on the job's backend (with ``top_logprobs`` > 0, each sampled id's most likely
        tokens too: ``GenerateResult.top_logprobs``).

        A backend that cannot be reached (the request never got there) is ejected from the balancer
        and the turn goes to another; the health checker re-admits it once it answers. While the farm
        is paused for a weight update the turn waits; a turn its backend aborted for the update is
        sent again once the farm resumes, so the caller only ever sees the re-issued turn.

        Raises:
            NoBackendAvailable: no healthy backend left.
            UpstreamError: the backend failed after it got the request (timeout, error status, bad
                body), or kept aborting it while the farm was not paused.
        """
        request = GenerateRequest(
            prompt_token_ids=prompt_ids, sampling=sampling or SamplingParams(), top_logprobs=top_logprobs
        )
        turn = _Turn(self)
        while turn.may_try():
            lease = await self._lease()
            try:
                result = await self.clients.get(lease).generate(request)
            except UpstreamConnectError as exc:
                await turn.unreachable(lease, exc)
                continue
            self.tokens.backend_tokens(lease.backend_id, prompt=len(prompt_ids), sampled=len(result.token_ids))
            if result.finish_reason is not FinishReason.ABORT:
                return stamped(result, lease.weight_version)
            await turn.aborted(lease)
        raise turn.exhausted()

    async def generate_stream(
        self, prompt_ids: list[int], sampling: SamplingParams | None = None, *, top_logprobs: int = 0
    ) -> AsyncGenerator[StreamItem, None]:
        """One turn, streamed: ``StreamDelta``s as the backend samples them, then the whole
        ``GenerateResult``. Closing the iterator early closes the request, which aborts it on the
        backend. A connect error before any id arrived goes to another backend, as in ``generate``.

        A weight update's abort (mode ``abort``) cannot take back ids already handed out: the turn
        waits for the resume and continues from them (its prompt plus the ids so far), and the
        result's ``weight_versions`` say which weights sampled which ids.

        Raises:
            NoBackendAvailable, UpstreamError: as ``generate``.
        """
        request = GenerateRequest(
            prompt_token_ids=prompt_ids, sampling=sampling or SamplingParams(), top_logprobs=top_logprobs
        )
        ids: list[int] = []
        logprobs: list[float] = []
        tops: list[TopLogprobs] = []
        versions: list[tuple[int, int, int]] = []
        turn = _Turn(self)
        start = time.perf_counter()
        while turn.may_try():
            lease = await self._lease()
            part = request if not ids else _continued(request, ids)
            result: GenerateResult | None = None
            try:
                async for item in self.clients.get(lease).generate_stream(part):
                    if isinstance(item, StreamDelta):
                        yield item
                    else:
                        result = stamped(item, lease.weight_version)
            except UpstreamConnectError as exc:
                await turn.unreachable(lease, exc)
                continue
            assert result is not None  # a stream ends with its result or raises
            prompt = len(part.prompt_token_ids)
            self.tokens.backend_tokens(lease.backend_id, prompt=prompt, sampled=len(result.token_ids))
            at = len(ids)
            ids += result.token_ids
            logprobs += result.logprobs
            tops += result.top_logprobs or []
            versions += [(v, at + s, at + e) for v, s, e in result.weight_versions]
            if result.finish_reason is not FinishReason.ABORT or len(ids) >= request.sampling.max_tokens:
                finish = result.finish_reason if result.finish_reason is not FinishReason.ABORT else FinishReason.LENGTH
                yield result.model_copy(
                    update={
                        "token_ids": ids,
                        "logprobs": logprobs,
                        "top_logprobs": tops if top_logprobs else None,
                        "weight_versions": versions,
                        "finish_reason": finish,
                        "prompt_tokens": len(prompt_ids),
                        "latency_s": time.perf_counter() - start,
                    }
                )
                return
            await turn.aborted(lease)
        raise turn.exhausted()

    async def _acquire(self) -> Lease:
        """The job's backend, once the farm is not paused for a weight update and (for up to
        ``backend_wait_s``) once a healthy backend is there."""
        deadline = time.monotonic() + self.backend_wait_s
        while True:
            try:
                lease = await self._blocking(self.balancer.acquire, self.job_id)
            except NoBackendAvailable:
                if time.monotonic() >= deadline:
                    raise
                await asyncio.sleep(NO_BACKEND_POLL_S)
                continue
            self._took(lease)
            if lease.paused is None:
                return lease
            if self.honour_reject and lease.paused.endswith(":reject"):
                raise BackendsPaused(
                    "the LLM backends are paused for a weight update; retry shortly", job_id=self.job_id
                )
            self.paused_s += await _wait_resumed(self.balancer)

    async def close(self) -> None:
        """Release the job's backend slot (idempotent)."""
        self.drop_found()
        await self._blocking(self._release)

    def _release(self) -> None:
        self.balancer.release(self.job_id)
        if self.count_tokens:
            self.tokens.send(self.balancer.redis)


class _Turn:
    """One turn's re-route and abort policy, the same for ``generate`` and ``generate_stream``: a
    backend that cannot be reached is marked unhealthy and the turn goes to another (``max_reroutes``
    times); a turn its backend aborted is sent again, at most ``MAX_UNPAUSED_ABORTS`` times while the
    farm is not paused (a weight update's abort is waited out however often it comes)."""

    def __init__(self, session: LLMSession) -> None:
        self.session = session
        self.reroutes = 0
        self.unpaused_aborts = 0
        self.last: UpstreamConnectError | None = None

    def may_try(self) -> bool:
        return self.reroutes <= self.session.max_reroutes

    async def unreachable(self, lease: Lease, exc: UpstreamConnectError) -> None:
        """The turn never reached ``lease``'s backend: take it out of the balancer until it answers."""
        self.last = exc
        self.reroutes += 1
        await self.session._blocking(self.session.balancer.set_healthy, lease.backend_id, False)

    async def aborted(self, lease: Lease) -> None:
        """``lease``'s backend aborted the turn.

        Raises:
            UpstreamError: it aborted once too often with the farm not paused.
        """
        session = self.session
        session.aborted_turns += 1
        if await session._blocking(session.balancer.paused) is None:
            self.unpaused_aborts += 1
            if self.unpaused_aborts > MAX_UNPAUSED_ABORTS:
                raise UpstreamError(
                    f"LLM backend aborted the turn {self.unpaused_aborts} times with the farm not paused",
                    backend=lease.backend_id,
                    job_id=session.job_id,
                )

    def exhausted(self) -> NoBackendAvailable:
        return NoBackendAvailable(
            f"no reachable LLM backend after {self.session.max_reroutes + 1} tries: {self.last}",
            job_id=self.session.job_id,
        )


#: how often a turn that found no healthy backend asks the balancer again (``backend_wait_s``).
NO_BACKEND_POLL_S = 0.5

#: how often a model call in flight looks at the cancel flag (the flag is read from Redis at most
#: every 0.25 s anyway).
CANCEL_POLL_S = 0.2


async def until_cancelled(call: Awaitable[T], is_cancelled: Callable[[], bool]) -> T:
    """``call``'s result; if ``is_cancelled`` turns true first, the call is cancelled, which closes its
    HTTP request (vLLM and the built-in backend abort a request whose client went away, so a stopped
    job stops costing model time at once, not at its turn's end), and ``Cancelled`` is raised."""
    task = asyncio.ensure_future(call)
    try:
        while True:
            done, _ = await asyncio.wait({task}, timeout=CANCEL_POLL_S)
            if done:
                return task.result()
            if is_cancelled():
                raise Cancelled("the job was cancelled during a model call")
    finally:
        if not task.done():
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task


def _continued(request: GenerateRequest, ids: list[int]) -> GenerateRequest:
    """The rest of a turn whose first ``ids`` were sampled (and handed out) before an abort."""
    sampling = request.sampling.model_copy(update={"max_tokens": request.sampling.max_tokens - len(ids)})
    return GenerateRequest(
        prompt_token_ids=[*request.prompt_token_ids, *ids], sampling=sampling, top_logprobs=request.top_logprobs
    )


def stamped(result: GenerateResult, weight_version: int) -> GenerateResult:
    """The result with its version spans: the backend's own where it reported them, else every id
    stamped with the version its backend had when the turn was sent."""
    if not result.weight_versions and result.token_ids:
        result.weight_versions = [(weight_version, 0, len(result.token_ids))]
    return result


async def _wait_resumed(balancer: Balancer) -> float:
    """Wait until the farm is not paused; returns the seconds waited."""
    start = time.monotonic()
    while await asyncio.to_thread(balancer.paused) is not None:
        await asyncio.sleep(PAUSE_POLL_S)
    return time.monotonic() - start
