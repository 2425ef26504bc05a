"""``FarmClient`` (sync) and ``AsyncFarmClient``: the farm's HTTP API for trainers.

Both build every request and read every answer in ``farm.client.base``; they differ only in how
a request is sent (httpx's ``Client`` and ``AsyncClient`` likewise): blocking, with the pages of
a results stream read ahead in threads, or awaited, with them read ahead in tasks.
"""

from __future__ import annotations

import asyncio
import os
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator, Mapping, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any, Literal, TypeVar

import httpx

from farm.client.base import (
    CLI_TOKEN,
    DEFAULT_PAGE_SIZE,
    DEFAULT_TIMEOUT_S,
    DEFAULT_WAIT_S,
    PREFETCH_PAGES,
    Call,
    PagesAhead,
    ResultsEncoding,
    Waiting,
    auth_headers,
    chosen_token,
    groups_end,
    naming_url,
    read_results_page,
)
from farm.client.binary import PageBuffer, body_buffer, decode_page
from farm.client.direct import DirectPages
from farm.client.retry import DEFAULT_RETRY, Attempts, RetryPolicy, retryable
from farm.client.steps import CarryCursor, Step, drain, drain_async, read_step, read_step_async
from farm.client.trials import AsyncTrialCalls, TrialCalls
from farm.errors import ApiError
from farm.schemas import (
    ArrayEncoding,
    BatchCreated,
    BatchLimits,
    BatchStatus,
    BatchTail,
    DynamicSampling,
    GroupResult,
    GroupsPage,
    HandlerInfo,
    Health,
    JobOut,
    JobResult,
    Overview,
    PassRate,
    PauseMode,
    Quorum,
    ResultsPage,
    SamplingParams,
    TaskSet,
    TaskSpec,
    TrajectoryOut,
    WeightsOut,
    WeightUpdateOut,
)
from farm.schemas.trials import TrialHistory

T = TypeVar("T")


class FarmClient(TrialCalls):
    """Synchronous client. Use as a context manager, or call ``close()``."""

    def __init__(
        self,
        base_url: str,
        *,
        token: str | None = CLI_TOKEN,
        timeout_s: float = DEFAULT_TIMEOUT_S,
        transport: httpx.BaseTransport | None = None,
        retry: RetryPolicy = DEFAULT_RETRY,
        proxy_url: str | None = None,
    ) -> None:
        """``retry``: how calls whose answer says "try again" are sent again (``farm.client.retry``;
        ``NO_RETRIES``: never). ``token`` left out: the one the ``farm`` command sends
        (``FARM_API__TOKEN``, else the token file ``farm up`` wrote: ``~/.rollout-farm/token``, or in
        ``FARM_DATA_DIR``); None: send none. ``proxy_url``: the ``farm proxy`` process a trial's base
        URLs name (unset: the API's own proxy, the one its answer names)."""
        headers = auth_headers(chosen_token(token))
        http = httpx.Client(base_url=base_url, headers=headers, timeout=timeout_s, transport=transport)
        super().__init__(http, timeout_s=timeout_s, retry=retry, proxy_url=proxy_url)
        # Results pages, megabytes each, are read straight into their buffers where nothing of
        # httpx's own is in play (see farm.client.direct).
        self._direct = DirectPages() if DirectPages.usable(http.base_url, transport=transport) else None

    def __enter__(self) -> FarmClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        self._http.close()
        if self._direct is not None:
            self._direct.close()

    def _send(self, call: Call[T]) -> T:
        return self._retrying(call.request, lambda: call.read(self._http.send(call.request)))

    def _retrying(self, request: httpx.Request, once: Callable[[], T]) -> T:
        """``once()``, called again while its failure says retry (``farm.client.retry``)."""
        attempts = Attempts(self._retry)
        while True:
            try:
                return once()
            except (httpx.TransportError, ApiError) as exc:
                if not retryable(exc, request) or (wait_s := attempts.wait_s()) is None:
                    if isinstance(exc, httpx.TransportError):
                        raise naming_url(exc, request) from exc
                    raise
            time.sleep(wait_s)

    def health(self) -> Health:
        return self._send(self._build_health())

    def handlers(self) -> list[HandlerInfo]:
        return self._send(self._build_handlers())

    def tasks(self, type: str | None = None) -> list[TaskSet]:
        """The tasks each installed task family ships (``type``: one family), with the config that
        submits each."""
        return self._send(self._build_tasks(type))

    def submit(
        self,
        tasks: Sequence[TaskSpec | Mapping[str, Any]],
        *,
        group_size: int = 1,
        sampling: SamplingParams | Mapping[str, Any] | None = None,
        metadata: Mapping[str, Any] | None = None,
        idempotency_key: str | None = None,
        max_staleness: int | None = None,
        on_stale: Literal["rerun", "mark"] = "rerun",
        dynamic: DynamicSampling | Mapping[str, Any] | None = None,
        history: TrialHistory | None = None,
        limits: BatchLimits | Mapping[str, Any] | None = None,
        quorum: Quorum | Mapping[str, Any] | None = None,
    ) -> BatchCreated:
        """Submit a batch. With ``idempotency_key``, a retried submit returns the same batch.

        ``max_staleness`` K: a rollout whose oldest sampled token is more than K weight versions
        behind the newest when its RUN ends is re-run (``on_stale="rerun"``) or kept with
        ``job.stale`` set (``"mark"``).

        ``dynamic`` (``DynamicSampling``) makes the tasks a pool for DAPO dynamic sampling: groups
        start from it until ``target_groups`` are informative, then the rest stop. Read such a
        batch with ``groups``.

        ``history`` is the batch's history policy where a chat template rewrites earlier turns:
        ``"exact"`` (the farm's default) keeps every sampled id, one segment per episode;
        ``"template"`` makes each rewrite start a segment, every one returned in
        ``TrajectoryOut.segments`` (``to_arrays(..., segments="all")`` gives one row per segment).

        ``limits`` (``BatchLimits``): per-stage limits, a job's wall budget, attempts; a job past one
        ends with outcome ``timeout``. ``quorum`` (``Quorum``): the share of the batch you need and
        by when; read the batch with ``step`` (the rest is cancelled, or carried to a later step)."""
        call = self._build_submit(
            tasks,
            group_size=group_size,
            sampling=sampling,
            metadata=metadata,
            idempotency_key=idempotency_key,
            max_staleness=max_staleness,
            on_stale=on_stale,
            dynamic=dynamic,
            history=history,
            limits=limits,
            quorum=quorum,
        )
        return self._send(call)

    def overview(self) -> Overview:
        """The farm at a glance: worker processes, queue depths, backends, running batches."""
        return self._send(self._build_overview())

    def status(self, batch_id: int) -> BatchStatus:
        return self._send(self._build_status(batch_id))

    def tail(self, batch_id: int) -> BatchTail:
        """Time to 50/90/99/100% of the batch, its readiness, and what was carried or cut by task."""
        return self._send(self._build_tail(batch_id))

    def step(self, batch_id: int, carry: CarryCursor | None = None, *, wait_s: float = DEFAULT_WAIT_S) -> Step:
        """The batch's step once it is ready (its quorum met or its deadline passed; a batch without a
        quorum: all of it), and, with ``carry``, every carried job of earlier steps that ended since,
        each exactly once (``farm.client.steps``)."""
        return read_step(self, batch_id, carry, wait_s=wait_s)

    def carried(self, carry: CarryCursor) -> list[JobResult]:
        """The carried jobs that ended since ``carry``'s place, each once, without waiting (``step``
        reads them too; this is for the end of training, or a trainer between steps)."""
        return drain(self, carry)

    def cancel(self, batch_id: int) -> BatchStatus:
        return self._send(self._build_cancel(batch_id))

    def job(self, job_id: int) -> JobOut:
        return self._send(self._build_job(job_id))

    def trajectory(self, job_id: int, *, encoding: ArrayEncoding = "b64") -> TrajectoryOut:
        return self._send(self._build_trajectory(job_id, encoding))

    def groups_page(
        self, batch_id: int, *, after: int = 0, limit: int = 16, wait_s: float = 0, encoding: ArrayEncoding = "b64"
    ) -> GroupsPage:
        """One page of a dynamic batch's informative groups (see ``groups``)."""
        return self._send(self._build_groups_page(batch_id, after=after, limit=limit, wait_s=wait_s, encoding=encoding))

    def groups(
        self, batch_id: int, *, after: int = 0, wait_s: float = DEFAULT_WAIT_S, encoding: ArrayEncoding = "b64"
    ) -> Iterator[GroupResult]:
        """Yield a dynamic batch's informative groups, whole, as the farm finds them, until it ends
        (target reached, or the pool spent: ``status(batch_id).dynamic.end_reason`` says which)."""
        while True:
            page = self.groups_page(batch_id, after=after, wait_s=wait_s, encoding=encoding)
            yield from page.items
            if groups_end(page):
                return
            after = page.next_cursor

    def pass_rates(self, keys: Sequence[str] | None = None, *, type: str | None = None) -> list[PassRate]:
        """The ledger's pass rates of prompts (``farm.schemas.task_key`` gives a task's key)."""
        return self._send(self._build_pass_rates(keys, type))

    # ---- weight updates ----------------------------------------------------------------------------
    def weights(self) -> WeightsOut:
        """The newest weight version, each backend's, and the update in progress (or the last one)."""
        return self._send(self._build_weights())

    def pause(
        self, *, mode: PauseMode = "keep", proxy: Literal["wait", "reject"] = "wait", timeout_s: float = 900.0
    ) -> WeightUpdateOut:
        """Pause every backend for a weight update (docs/trainer.md, "Weight updates"); new turns wait.
        Returns the update: pass its ``id`` to ``load_weights``, ``resume`` or ``rollback``."""
        return self._send(self._build_pause(mode, proxy, timeout_s))

    def load_weights(self, update_id: int, *, path: str | os.PathLike[str], version: int) -> WeightUpdateOut:
        """Every paused backend loads the checkpoint directory ``path`` (readable where they run)."""
        return self._send(self._build_load_weights(update_id, path, version))

    def resume(self, update_id: int, *, version: int | None = None) -> WeightUpdateOut:
        """Resume at ``version`` (the loaded one if unset)."""
        return self._send(self._build_resume(update_id, version))

    def rollback(self, update_id: int) -> WeightUpdateOut:
        """Give the update up: every backend resumes with the weights it holds."""
        return self._send(self._build_rollback(update_id))

    # ---- results -----------------------------------------------------------------------------------
    def results_page(
        self,
        batch_id: int,
        *,
        after: int = 0,
        page_size: int = DEFAULT_PAGE_SIZE,
        wait_s: float = 0,
        encoding: ResultsEncoding = "binary",
        trajectories: bool = True,
        until_ready: bool = False,
    ) -> ResultsPage:
        """One page of the results stream (see ``results``)."""
        request = self._build_results_page(
            batch_id,
            after=after,
            page_size=page_size,
            wait_s=wait_s,
            encoding=encoding,
            trajectories=trajectories,
            until_ready=until_ready,
        )
        # A page is asked for by its cursor: asking again reads the same results, none twice.
        return self._retrying(request, lambda: self._results_page_once(request))

    def _results_page_once(self, request: httpx.Request) -> ResultsPage:
        if self._direct is not None:
            answer, body = self._direct.send(request, body_buffer)
            return read_results_page(answer) if body is None else decode_page(body.data)
        response = self._http.send(request, stream=True)
        try:
            buffer = body_buffer(response)
            if buffer is None:
                response.read()
                return read_results_page(response)
            page = PageBuffer(buffer)
            for chunk in response.iter_bytes():
                page.add(chunk)
            return page.page()
        finally:
            response.close()

    def results(
        self,
        batch_id: int,
        *,
        after: int = 0,
        page_size: int = DEFAULT_PAGE_SIZE,
        wait_s: float = DEFAULT_WAIT_S,
        encoding: ResultsEncoding = "binary",
        trajectories: bool = True,
    ) -> Iterator[JobResult]:
        """Yield every finished job as it finishes (done, failed or cancelled), until none is left.

        The next page is requested while the caller works on the current one, so reading a
        large finished batch overlaps the server's work with the trainer's; the first page holds
        at most ``FIRST_PAGE_SIZE`` results, so the ones after it are asked for sooner. ``encoding``
        "binary" (the default) reads each trajectory's arrays as raw bytes (``RawArray``,
        views of the page: ``to_arrays`` takes them as they are).
        """

        def fetch(cursor: int, size: int = page_size) -> ResultsPage:
            return self.results_page(
                batch_id, after=cursor, page_size=size, wait_s=wait_s, encoding=encoding, trajectories=trajectories
            )

        pool = ThreadPoolExecutor(max_workers=PREFETCH_PAGES, thread_name_prefix="farm-results")
        ahead: PagesAhead[Future[ResultsPage]] = PagesAhead(page_size, lambda c: pool.submit(fetch, c), Future.cancel)
        ended = False
        try:
            page = fetch(after, ahead.first_size)
            while True:
                more = ahead.plan(page)
                yield from page.items
                if not more:
                    break
                page = ahead.next().result()
            ended = True
        finally:
            # A caller that stops early must not wait for a long-poll in flight. At the end nothing
            # is in flight.
            pool.shutdown(wait=ended, cancel_futures=True)

    def wait(self, batch_id: int, *, timeout_s: float | None = None, poll_s: float = 0.5) -> BatchStatus:
        """Block until the batch is complete or cancelled; TimeoutError after ``timeout_s``."""
        waiting = Waiting(batch_id, timeout_s)
        while not waiting.over(status := self.status(batch_id)):
            time.sleep(poll_s)
        return status


class AsyncFarmClient(AsyncTrialCalls):
    """The same API as ``FarmClient``, for asyncio trainers."""

    def __init__(
        self,
        base_url: str,
        *,
        token: str | None = CLI_TOKEN,
        timeout_s: float = DEFAULT_TIMEOUT_S,
        transport: httpx.AsyncBaseTransport | None = None,
        retry: RetryPolicy = DEFAULT_RETRY,
        proxy_url: str | None = None,
    ) -> None:
        """See ``FarmClient``."""
        headers = auth_headers(chosen_token(token))
        http = httpx.AsyncClient(base_url=base_url, headers=headers, timeout=timeout_s, transport=transport)
        super().__init__(http, timeout_s=timeout_s, retry=retry, proxy_url=proxy_url)

    async def __aenter__(self) -> AsyncFarmClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def close(self) -> None:
        await self._http.aclose()

    async def _send(self, call: Call[T]) -> T:
        async def once() -> T:
            return call.read(await self._http.send(call.request))

        return await self._retrying(call.request, once)

    async def _retrying(self, request: httpx.Request, once: Callable[[], Awaitable[T]]) -> T:
        """See ``FarmClient._retrying``."""
        attempts = Attempts(self._retry)
        while True:
            try:
                return await once()
            except (httpx.TransportError, ApiError) as exc:
                if not retryable(exc, request) or (wait_s := attempts.wait_s()) is None:
                    if isinstance(exc, httpx.TransportError):
                        raise naming_url(exc, request) from exc
                    raise
            await asyncio.sleep(wait_s)

    async def health(self) -> Health:
        return await self._send(self._build_health())

    async def handlers(self) -> list[HandlerInfo]:
        """See ``FarmClient.handlers``."""
        return await self._send(self._build_handlers())

    async def tasks(self, type: str | None = None) -> list[TaskSet]:
        """See ``FarmClient.tasks``."""
        return await self._send(self._build_tasks(type))

    async def submit(
        self,
        tasks: Sequence[TaskSpec | Mapping[str, Any]],
        *,
        group_size: int = 1,
        sampling: SamplingParams | Mapping[str, Any] | None = None,
        metadata: Mapping[str, Any] | None = None,
        idempotency_key: str | None = None,
        max_staleness: int | None = None,
        on_stale: Literal["rerun", "mark"] = "rerun",
        dynamic: DynamicSampling | Mapping[str, Any] | None = None,
        history: TrialHistory | None = None,
        limits: BatchLimits | Mapping[str, Any] | None = None,
        quorum: Quorum | Mapping[str, Any] | None = None,
    ) -> BatchCreated:
        """See ``FarmClient.submit``."""
        call = self._build_submit(
            tasks,
            group_size=group_size,
            sampling=sampling,
            metadata=metadata,
            idempotency_key=idempotency_key,
            max_staleness=max_staleness,
            on_stale=on_stale,
            dynamic=dynamic,
            history=history,
            limits=limits,
            quorum=quorum,
        )
        return await self._send(call)

    async def overview(self) -> Overview:
        """See ``FarmClient.overview``."""
        return await self._send(self._build_overview())

    async def status(self, batch_id: int) -> BatchStatus:
        return await self._send(self._build_status(batch_id))

    async def tail(self, batch_id: int) -> BatchTail:
        """See ``FarmClient.tail``."""
        return await self._send(self._build_tail(batch_id))

    async def step(self, batch_id: int, carry: CarryCursor | None = None, *, wait_s: float = DEFAULT_WAIT_S) -> Step:
        """See ``FarmClient.step``."""
        return await read_step_async(self, batch_id, carry, wait_s=wait_s)

    async def carried(self, carry: CarryCursor) -> list[JobResult]:
        """See ``FarmClient.carried``."""
        return await drain_async(self, carry)

    async def cancel(self, batch_id: int) -> BatchStatus:
        return await self._send(self._build_cancel(batch_id))

    async def job(self, job_id: int) -> JobOut:
        return await self._send(self._build_job(job_id))

    async def trajectory(self, job_id: int, *, encoding: ArrayEncoding = "b64") -> TrajectoryOut:
        return await self._send(self._build_trajectory(job_id, encoding))

    async def groups_page(
        self, batch_id: int, *, after: int = 0, limit: int = 16, wait_s: float = 0, encoding: ArrayEncoding = "b64"
    ) -> GroupsPage:
        """See ``FarmClient.groups_page``."""
        call = self._build_groups_page(batch_id, after=after, limit=limit, wait_s=wait_s, encoding=encoding)
        return await self._send(call)

    async def groups(
        self, batch_id: int, *, after: int = 0, wait_s: float = DEFAULT_WAIT_S, encoding: ArrayEncoding = "b64"
    ) -> AsyncIterator[GroupResult]:
        """See ``FarmClient.groups``."""
        while True:
            page = await self.groups_page(batch_id, after=after, wait_s=wait_s, encoding=encoding)
            for item in page.items:
                yield item
            if groups_end(page):
                return
            after = page.next_cursor

    async def pass_rates(self, keys: Sequence[str] | None = None, *, type: str | None = None) -> list[PassRate]:
        """See ``FarmClient.pass_rates``."""
        return await self._send(self._build_pass_rates(keys, type))

    # ---- weight updates ----------------------------------------------------------------------------
    async def weights(self) -> WeightsOut:
        """See ``FarmClient.weights``."""
        return await self._send(self._build_weights())

    async def pause(
        self, *, mode: PauseMode = "keep", proxy: Literal["wait", "reject"] = "wait", timeout_s: float = 900.0
    ) -> WeightUpdateOut:
        """See ``FarmClient.pause``."""
        return await self._send(self._build_pause(mode, proxy, timeout_s))

    async def load_weights(self, update_id: int, *, path: str | os.PathLike[str], version: int) -> WeightUpdateOut:
        """See ``FarmClient.load_weights``."""
        return await self._send(self._build_load_weights(update_id, path, version))

    async def resume(self, update_id: int, *, version: int | None = None) -> WeightUpdateOut:
        """See ``FarmClient.resume``."""
        return await self._send(self._build_resume(update_id, version))

    async def rollback(self, update_id: int) -> WeightUpdateOut:
        """See ``FarmClient.rollback``."""
        return await self._send(self._build_rollback(update_id))

    # ---- results -----------------------------------------------------------------------------------
    async def results_page(
        self,
        batch_id: int,
        *,
        after: int = 0,
        page_size: int = DEFAULT_PAGE_SIZE,
        wait_s: float = 0,
        encoding: ResultsEncoding = "binary",
        trajectories: bool = True,
        until_ready: bool = False,
    ) -> ResultsPage:
        """See ``FarmClient.results_page``."""
        request = self._build_results_page(
            batch_id,
            after=after,
            page_size=page_size,
            wait_s=wait_s,
            encoding=encoding,
            trajectories=trajectories,
            until_ready=until_ready,
        )
        return await self._retrying(request, lambda: self._results_page_once(request))

    async def _results_page_once(self, request: httpx.Request) -> ResultsPage:
        response = await self._http.send(request, stream=True)
        try:
            buffer = body_buffer(response)
            if buffer is None:
                await response.aread()
                return read_results_page(response)
            page = PageBuffer(buffer)
            async for chunk in response.aiter_bytes():
                page.add(chunk)
            return page.page()
        finally:
            await response.aclose()

    async def results(
        self,
        batch_id: int,
        *,
        after: int = 0,
        page_size: int = DEFAULT_PAGE_SIZE,
        wait_s: float = DEFAULT_WAIT_S,
        encoding: ResultsEncoding = "binary",
        trajectories: bool = True,
    ) -> AsyncIterator[JobResult]:
        """See ``FarmClient.results``: the next page is requested while the caller works on this one."""

        async def fetch(cursor: int, size: int = page_size) -> ResultsPage:
            return await self.results_page(
                batch_id, after=cursor, page_size=size, wait_s=wait_s, encoding=encoding, trajectories=trajectories
            )

        ahead: PagesAhead[asyncio.Task[ResultsPage]] = PagesAhead(
            page_size, lambda c: asyncio.create_task(fetch(c)), asyncio.Task.cancel
        )
        try:
            page = await fetch(after, ahead.first_size)
            while True:
                more = ahead.plan(page)
                for item in page.items:
                    yield item
                if not more:
                    break
                page = await ahead.next()
        finally:
            # A caller that stops early must not leave a long-poll running.
            ahead.cancel()

    async def wait(self, batch_id: int, *, timeout_s: float | None = None, poll_s: float = 0.5) -> BatchStatus:
        """See ``FarmClient.wait``."""
        waiting = Waiting(batch_id, timeout_s)
        while not waiting.over(status := await self.status(batch_id)):
            await asyncio.sleep(poll_s)
        return status
