"""``FarmClient`` (sync) and ``AsyncFarmClient``: the farm's HTTP API for trainers.

Both build requests and read answers through the same helpers, so they cannot drift.
Any error answer raises an ``ApiError(status, code, detail)`` that is also the farm error class of
its code (``except NotFound``, ``except InvalidSpec``; see ``farm.errors.HTTP_ERRORS``).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Iterator, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any, TypeVar

import httpx
from pydantic import BaseModel

from farm.constants import BatchState
from farm.errors import api_error
from farm.schemas import (
    ArrayEncoding,
    BatchCreate,
    BatchCreated,
    BatchStatus,
    HandlerInfo,
    Health,
    JobOut,
    JobResult,
    ResultsPage,
    SamplingParams,
    TaskSet,
    TaskSpec,
    TrajectoryOut,
)

#: per-request timeout; long-polls add their wait on top.
DEFAULT_TIMEOUT_S = 30.0
#: how long one results long-poll is held by the server.
DEFAULT_WAIT_S = 20.0
DEFAULT_PAGE_SIZE = 100

M = TypeVar("M", bound=BaseModel)


def _batch_body(
    tasks: Sequence[TaskSpec | Mapping[str, Any]],
    group_size: int,
    sampling: SamplingParams | Mapping[str, Any] | None,
    metadata: Mapping[str, Any] | None,
) -> dict[str, Any]:
    request = BatchCreate(
        tasks=[t if isinstance(t, TaskSpec) else TaskSpec.model_validate(t) for t in tasks],
        group_size=group_size,
        sampling=sampling if isinstance(sampling, SamplingParams) else SamplingParams.model_validate(sampling or {}),
        metadata=dict(metadata or {}),
    )
    return request.model_dump(mode="json")


def _check(response: httpx.Response) -> httpx.Response:
    if response.is_success:
        return response
    field = None
    try:
        body = response.json()
        code, detail, field = body.get("code", "http_error"), body.get("detail", response.text), body.get("field")
    except (ValueError, AttributeError):
        code, detail = "http_error", response.text or response.reason_phrase
    raise api_error(response.status_code, code, str(detail), field)


def _parse(model: type[M], response: httpx.Response) -> M:
    return model.model_validate_json(_check(response).content)


def _results_params(
    after: int, page_size: int, wait_s: float, encoding: ArrayEncoding, trajectories: bool
) -> dict[str, Any]:
    return {"after": after, "limit": page_size, "wait_s": wait_s, "encoding": encoding, "trajectories": trajectories}


def _headers(token: str | None) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"} if token else {}


class FarmClient:
    """Synchronous client. Use as a context manager, or call ``close()``."""

    def __init__(
        self,
        base_url: str,
        *,
        token: str | None,
        timeout_s: float = DEFAULT_TIMEOUT_S,
        transport: httpx.BaseTransport | None = None,
    ) -> None:
        self._timeout_s = timeout_s
        self._http = httpx.Client(base_url=base_url, headers=_headers(token), timeout=timeout_s, transport=transport)

    def __enter__(self) -> FarmClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        self._http.close()

    def health(self) -> Health:
        return _parse(Health, self._http.get("/readyz"))

    def handlers(self) -> list[HandlerInfo]:
        return [HandlerInfo.model_validate(h) for h in _check(self._http.get("/v1/handlers")).json()]

    def tasks(self, type: str | None = None) -> list[TaskSet]:
        """The tasks each installed task family ships (``type``: one family), with the config that
        submits each."""
        response = _check(self._http.get("/v1/tasks", params={"type": type} if type else None))
        return [TaskSet.model_validate(item) for item in response.json()]

    def submit(
        self,
        tasks: Sequence[TaskSpec | Mapping[str, Any]],
        *,
        group_size: int = 1,
        sampling: SamplingParams | Mapping[str, Any] | None = None,
        metadata: Mapping[str, Any] | None = None,
        idempotency_key: str | None = None,
    ) -> BatchCreated:
        """Submit a batch. With ``idempotency_key``, a retried submit returns the same batch."""
        headers = {"Idempotency-Key": idempotency_key} if idempotency_key else None
        body = _batch_body(tasks, group_size, sampling, metadata)
        return _parse(BatchCreated, self._http.post("/v1/batches", json=body, headers=headers))

    def status(self, batch_id: int) -> BatchStatus:
        return _parse(BatchStatus, self._http.get(f"/v1/batches/{batch_id}"))

    def cancel(self, batch_id: int) -> BatchStatus:
        return _parse(BatchStatus, self._http.post(f"/v1/batches/{batch_id}/cancel"))

    def job(self, job_id: int) -> JobOut:
        return _parse(JobOut, self._http.get(f"/v1/jobs/{job_id}"))

    def trajectory(self, job_id: int, *, encoding: ArrayEncoding = "b64") -> TrajectoryOut:
        return _parse(TrajectoryOut, self._http.get(f"/v1/jobs/{job_id}/trajectory", params={"encoding": encoding}))

    def results_page(
        self,
        batch_id: int,
        *,
        after: int = 0,
        page_size: int = DEFAULT_PAGE_SIZE,
        wait_s: float = 0,
        encoding: ArrayEncoding = "b64",
        trajectories: bool = True,
    ) -> ResultsPage:
        params = _results_params(after, page_size, wait_s, encoding, trajectories)
        response = self._http.get(f"/v1/batches/{batch_id}/results", params=params, timeout=self._timeout_s + wait_s)
        return _parse(ResultsPage, response)

    def results(
        self,
        batch_id: int,
        *,
        after: int = 0,
        page_size: int = DEFAULT_PAGE_SIZE,
        wait_s: float = DEFAULT_WAIT_S,
        encoding: ArrayEncoding = "b64",
        trajectories: bool = True,
    ) -> Iterator[JobResult]:
        """Yield every finished job as it finishes (done, failed or cancelled), until none is left.

        The next page is requested while the caller works on the current one, so reading a
        large finished batch overlaps the server's work with the trainer's.
        """

        def fetch(cursor: int) -> ResultsPage:
            return self.results_page(
                batch_id,
                after=cursor,
                page_size=page_size,
                wait_s=wait_s,
                encoding=encoding,
                trajectories=trajectories,
            )

        pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="farm-results")
        try:
            page = fetch(after)
            while page.items or (page.remaining > 0 and page.batch_state is BatchState.RUNNING):
                upcoming = pool.submit(fetch, page.next_cursor)
                yield from page.items
                page = upcoming.result()
        finally:
            # A caller that stops early must not wait for a long-poll in flight.
            pool.shutdown(wait=False, cancel_futures=True)

    def wait(self, batch_id: int, *, timeout_s: float | None = None, poll_s: float = 0.5) -> BatchStatus:
        """Block until the batch is complete or cancelled; TimeoutError after ``timeout_s``."""
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        while True:
            status = self.status(batch_id)
            if status.state is not BatchState.RUNNING:
                return status
            if deadline is not None and time.monotonic() >= deadline:
                raise TimeoutError(f"batch {batch_id} still running after {timeout_s}s: {status.counts}")
            time.sleep(poll_s)


class AsyncFarmClient:
    """The same API as ``FarmClient``, for asyncio trainers."""

    def __init__(
        self,
        base_url: str,
        *,
        token: str | None,
        timeout_s: float = DEFAULT_TIMEOUT_S,
        transport: httpx.AsyncBaseTransport | None = None,
    ) -> None:
        self._timeout_s = timeout_s
        self._http = httpx.AsyncClient(
            base_url=base_url, headers=_headers(token), timeout=timeout_s, transport=transport
        )

    async def __aenter__(self) -> AsyncFarmClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def close(self) -> None:
        await self._http.aclose()

    async def health(self) -> Health:
        return _parse(Health, await self._http.get("/readyz"))

    async def tasks(self, type: str | None = None) -> list[TaskSet]:
        """See ``FarmClient.tasks``."""
        response = _check(await self._http.get("/v1/tasks", params={"type": type} if type else None))
        return [TaskSet.model_validate(item) for item in response.json()]

    async def submit(
        self,
        tasks: Sequence[TaskSpec | Mapping[str, Any]],
        *,
        group_size: int = 1,
        sampling: SamplingParams | Mapping[str, Any] | None = None,
        metadata: Mapping[str, Any] | None = None,
        idempotency_key: str | None = None,
    ) -> BatchCreated:
        headers = {"Idempotency-Key": idempotency_key} if idempotency_key else None
        body = _batch_body(tasks, group_size, sampling, metadata)
        return _parse(BatchCreated, await self._http.post("/v1/batches", json=body, headers=headers))

    async def status(self, batch_id: int) -> BatchStatus:
        return _parse(BatchStatus, await self._http.get(f"/v1/batches/{batch_id}"))

    async def cancel(self, batch_id: int) -> BatchStatus:
        return _parse(BatchStatus, await self._http.post(f"/v1/batches/{batch_id}/cancel"))

    async def job(self, job_id: int) -> JobOut:
        return _parse(JobOut, await self._http.get(f"/v1/jobs/{job_id}"))

    async def trajectory(self, job_id: int, *, encoding: ArrayEncoding = "b64") -> TrajectoryOut:
        response = await self._http.get(f"/v1/jobs/{job_id}/trajectory", params={"encoding": encoding})
        return _parse(TrajectoryOut, response)

    async def results_page(
        self,
        batch_id: int,
        *,
        after: int = 0,
        page_size: int = DEFAULT_PAGE_SIZE,
        wait_s: float = 0,
        encoding: ArrayEncoding = "b64",
        trajectories: bool = True,
    ) -> ResultsPage:
        params = _results_params(after, page_size, wait_s, encoding, trajectories)
        response = await self._http.get(
            f"/v1/batches/{batch_id}/results", params=params, timeout=self._timeout_s + wait_s
        )
        return _parse(ResultsPage, response)

    async def results(
        self,
        batch_id: int,
        *,
        after: int = 0,
        page_size: int = DEFAULT_PAGE_SIZE,
        wait_s: float = DEFAULT_WAIT_S,
        encoding: ArrayEncoding = "b64",
        trajectories: bool = True,
    ) -> AsyncIterator[JobResult]:
        cursor = after
        while True:
            page = await self.results_page(
                batch_id,
                after=cursor,
                page_size=page_size,
                wait_s=wait_s,
                encoding=encoding,
                trajectories=trajectories,
            )
            for item in page.items:
                yield item
            cursor = page.next_cursor
            if not page.items and (page.remaining == 0 or page.batch_state is not BatchState.RUNNING):
                return

    async def wait(self, batch_id: int, *, timeout_s: float | None = None, poll_s: float = 0.5) -> BatchStatus:
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        while True:
            status = await self.status(batch_id)
            if status.state is not BatchState.RUNNING:
                return status
            if deadline is not None and time.monotonic() >= deadline:
                raise TimeoutError(f"batch {batch_id} still running after {timeout_s}s: {status.counts}")
            await asyncio.sleep(poll_s)
