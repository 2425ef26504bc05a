"""``FarmClient`` (sync) and ``AsyncFarmClient``: the farm's HTTP API for trainers.

Both build requests and read answers through the same helpers, so they cannot drift.
Any error answer raises an ``ApiError(status, code, detail)`` that is also the farm error class of
its code (``except NotFound``, ``except InvalidSpec``; see ``farm.errors.HTTP_ERRORS``).
"""

from __future__ import annotations

import asyncio
import os
import struct
import time
from collections import deque
from collections.abc import AsyncIterator, Iterator, Mapping, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any, Literal, TypeVar

import httpx
import numpy as np
import numpy.typing as npt
import pydantic_core
from pydantic import BaseModel, ValidationError

from farm.client.direct import DirectPages
from farm.constants import BatchState
from farm.errors import ApiError, api_error
from farm.schemas import (
    RESULTS_MAGIC,
    RESULTS_MEDIA_TYPE,
    ArrayEncoding,
    BatchCreate,
    BatchCreated,
    BatchStatus,
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
    RawArray,
    ResultsPage,
    SamplingParams,
    TaskSet,
    TaskSpec,
    TrajectoryOut,
    WeightLoad,
    WeightPause,
    WeightResume,
    WeightsOut,
    WeightUpdateOut,
)

#: per-request timeout; long-polls add their wait on top.
DEFAULT_TIMEOUT_S = 30.0
#: weight-update calls: a pause in mode wait lasts until the backends' in-flight turns end.
CONTROL_TIMEOUT_S = 900.0
#: how long one results long-poll is held by the server.
DEFAULT_WAIT_S = 20.0
DEFAULT_PAGE_SIZE = 100
#: pages of a finished batch requested ahead of the one the caller reads (see ``_plan_ahead``).
PREFETCH_PAGES = 3
#: results in the first page of a stream (at most the page size): a small page answers sooner,
#: and the pages after it are requested as soon as it tells the batch's state.
FIRST_PAGE_SIZE = 8

#: how results pages carry arrays: "binary" asks for the binary page (raw bytes, the fastest;
#: a server that answers JSON instead is read as b64), "b64" and "json" for JSON pages.
ResultsEncoding = Literal["binary", "b64", "json"]
#: what a binary-page request accepts: the binary page, else JSON.
_BINARY_ACCEPT = f"{RESULTS_MEDIA_TYPE}, application/json;q=0.5"
_ITEMSIZE = {"int32": 4, "float32": 4, "uint8": 1}
_ARRAY_FIELDS = ("token_ids", "logprobs", "loss_mask")

M = TypeVar("M", bound=BaseModel)


def _batch_body(
    tasks: Sequence[TaskSpec | Mapping[str, Any]],
    group_size: int,
    sampling: SamplingParams | Mapping[str, Any] | None,
    metadata: Mapping[str, Any] | None,
    max_staleness: int | None = None,
    on_stale: Literal["rerun", "mark"] = "rerun",
    dynamic: DynamicSampling | Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    given = {
        "tasks": list(tasks),
        "group_size": group_size,
        "sampling": sampling if sampling is not None else {},
        "metadata": dict(metadata or {}),
        "max_staleness": max_staleness,
        "on_stale": on_stale,
        "dynamic": dynamic,
    }
    try:
        request = BatchCreate.model_validate(given)
    except ValidationError as exc:
        # The API's own answer to this batch, so one ``except ApiError`` (or InvalidSpec) serves both.
        first = exc.errors()[0]
        field = ".".join(str(p) for p in first["loc"]) or None
        more = f" (and {exc.error_count() - 1} more)" if exc.error_count() > 1 else ""
        raise api_error(422, "invalid_request", f"{field}: {first['msg']}{more}", field) from None
    body = request.model_dump(mode="json", exclude_none=False)
    # The sampling fields the trainer set, not the defaults: a harness job overrides only those.
    body["sampling"] = request.sampling.model_dump(mode="json", exclude_unset=True)
    # Options left unset stay out of the body: one any farm version takes.
    if max_staleness is None:
        del body["max_staleness"], body["on_stale"]
    if dynamic is None:
        del body["dynamic"]
    return body


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


def _results_request(
    after: int, page_size: int, wait_s: float, encoding: ResultsEncoding, trajectories: bool
) -> tuple[dict[str, Any], dict[str, str]]:
    """Query parameters and headers of a results page request."""
    params = {
        "after": after,
        "limit": page_size,
        "wait_s": wait_s,
        "encoding": "b64" if encoding == "binary" else encoding,
        "trajectories": trajectories,
    }
    return params, {"Accept": _BINARY_ACCEPT} if encoding == "binary" else {}


def _read_all(page: ResultsPage) -> bool:
    """Whether the stream ends with ``page``: it is empty and no job is left to wait for (none
    unfinished, or the batch no longer running), or the batch no longer runs and the page reached
    its last finish position (so no request is spent on an empty page past the end)."""
    if page.batch_state is BatchState.RUNNING:
        return not page.items and page.remaining <= 0
    return not page.items or page.next_cursor >= page.finished


def _plan_ahead(page: ResultsPage, page_size: int, ahead: list[int]) -> tuple[bool, list[int]]:
    """After reading ``page``: whether the pages already requested (their cursors, in order) are
    still the right ones, and the cursors to request now.

    The next page is always in flight until the stream ends. A finished batch's finish positions
    are all taken and dense (1..``finished``), so the pages after this one are known too: up to
    ``PREFETCH_PAGES`` of them are requested at once, and the server reads one from the database
    while it sends another; none past the last position. A running batch's pages are requested
    one at a time (a long-poll decides what each holds)."""
    if _read_all(page):
        return False, []
    valid = bool(ahead) and ahead[0] == page.next_cursor
    kept = ahead if valid else []
    cursors = [] if kept else [page.next_cursor]
    last = (kept or cursors)[-1]
    if page.batch_state is not BatchState.RUNNING:
        while len(kept) + len(cursors) < PREFETCH_PAGES and last + page_size < page.finished:
            last += page_size
            cursors.append(last)
    return valid, cursors


def _binary_page(body: bytes | memoryview) -> ResultsPage:
    """A binary results page (layout: README, "Binary results pages"); arrays stay views of ``body``.

    Raises:
        ApiError: the body is not a binary results page.
    """
    if body[: len(RESULTS_MAGIC)] != RESULTS_MAGIC or len(body) < len(RESULTS_MAGIC) + 4:
        raise ApiError(200, "bad_page", f"not a binary results page (starts {bytes(body[:8])!r})")
    start = len(RESULTS_MAGIC) + 4
    (length,) = struct.unpack_from("<I", body, len(RESULTS_MAGIC))
    header = pydantic_core.from_json(bytes(body[start : start + length]))  # ~2x json.loads
    data = memoryview(body)[start + length :]
    arrays: list[list[RawArray]] = []
    for item in header["items"]:
        traj = item.get("trajectory")
        if traj is None:
            continue
        views = []
        for name in _ARRAY_FIELDS:
            ref = traj[name]
            end = ref["offset"] + ref["length"] * _ITEMSIZE[ref["dtype"]]
            if end > len(data):
                raise ApiError(200, "bad_page", f"job {traj['job_id']}'s {name} runs past the page's end")
            views.append(RawArray(dtype=ref["dtype"], data=data[ref["offset"] : end]))
            # Validated as an empty list, then set: a RawArray in the union costs pydantic more
            # (it tries the other branches first) than the rest of the page.
            traj[name] = []
        arrays.append(views)
    page = ResultsPage.model_validate(header)
    trajs = [item.trajectory for item in page.items if item.trajectory is not None]
    for out, views in zip(trajs, arrays, strict=True):
        out.token_ids, out.logprobs, out.loss_mask = views
    return page


def _is_binary(response: httpx.Response) -> bool:
    content_type: str = response.headers.get("content-type", "")
    return content_type.split(";")[0].strip() == RESULTS_MEDIA_TYPE


def _results_page(response: httpx.Response) -> ResultsPage:
    """A results page as the server chose to send it: binary or JSON (the body read already)."""
    _check(response)
    if _is_binary(response):
        return _binary_page(response.content)
    return ResultsPage.model_validate_json(response.content)


def _body_buffer(response: httpx.Response) -> npt.NDArray[np.uint8] | None:
    """Where to read a binary page's body, not read yet: a NumPy buffer of its Content-Length.
    NumPy asks the kernel for huge pages for large arrays, so a page of megabytes costs a few
    page faults instead of one per 4 KB. None: read the body as httpx does (an error, JSON, or a
    body without a plain length)."""
    if not (response.is_success and _is_binary(response)) or "content-encoding" in response.headers:
        return None
    try:
        return np.empty(int(response.headers["content-length"]), dtype=np.uint8)
    except (KeyError, ValueError):
        return None


def _put(buffer: memoryview, filled: int, chunk: bytes) -> int:
    """Copy ``chunk`` into ``buffer`` at ``filled``; returns the new fill.

    Raises:
        ApiError: the body is longer than its Content-Length.
    """
    end = filled + len(chunk)
    if end > len(buffer):
        raise ApiError(200, "bad_page", "the results page is longer than its Content-Length")
    buffer[filled:end] = chunk
    return end


def _filled_page(buffer: memoryview, filled: int) -> ResultsPage:
    if filled != len(buffer):
        raise ApiError(200, "bad_page", f"the results page ended after {filled} of {len(buffer)} bytes")
    return _binary_page(buffer)


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
        # Results pages, megabytes each, are read straight into their buffers where nothing of
        # httpx's own is in play (see farm.client.direct).
        self._direct = DirectPages() if DirectPages.usable(self._http.base_url, transport=transport) else None

    def __enter__(self) -> FarmClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        self._http.close()
        if self._direct is not None:
            self._direct.close()

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
        max_staleness: int | None = None,
        on_stale: Literal["rerun", "mark"] = "rerun",
        dynamic: DynamicSampling | Mapping[str, Any] | None = None,
    ) -> BatchCreated:
        """Submit a batch. With ``idempotency_key``, a retried submit returns the same batch.

        ``max_staleness`` K: a rollout whose oldest sampled token is more than K weight versions
        behind the newest when its RUN ends is re-run (``on_stale="rerun"``) or kept with
        ``job.stale`` set (``"mark"``).

        ``dynamic`` (``DynamicSampling``) makes the tasks a pool for DAPO dynamic sampling: groups
        start from it until ``target_groups`` are informative, then the rest stop. Read such a
        batch with ``groups``."""
        headers = {"Idempotency-Key": idempotency_key} if idempotency_key else None
        body = _batch_body(tasks, group_size, sampling, metadata, max_staleness, on_stale, dynamic)
        return _parse(BatchCreated, self._http.post("/v1/batches", json=body, headers=headers))

    def overview(self) -> Overview:
        """The farm at a glance: worker processes, queue depths, backends, running batches."""
        return _parse(Overview, self._http.get("/v1/overview"))

    def status(self, batch_id: int) -> BatchStatus:
        return _parse(BatchStatus, self._http.get(f"/v1/batches/{batch_id}"))

    def cancel(self, batch_id: int) -> BatchStatus:
        return _parse(BatchStatus, self._http.post(f"/v1/batches/{batch_id}/cancel"))

    def job(self, job_id: int) -> JobOut:
        return _parse(JobOut, self._http.get(f"/v1/jobs/{job_id}"))

    def trajectory(self, job_id: int, *, encoding: ArrayEncoding = "b64") -> TrajectoryOut:
        return _parse(TrajectoryOut, self._http.get(f"/v1/jobs/{job_id}/trajectory", params={"encoding": encoding}))

    def groups_page(
        self, batch_id: int, *, after: int = 0, limit: int = 16, wait_s: float = 0, encoding: ArrayEncoding = "b64"
    ) -> GroupsPage:
        """One page of a dynamic batch's informative groups (see ``groups``)."""
        params = {"after": after, "limit": limit, "wait_s": wait_s, "encoding": encoding}
        url, timeout = f"/v1/batches/{batch_id}/groups", self._timeout_s + wait_s
        return _parse(GroupsPage, self._http.get(url, params=params, timeout=timeout))

    def groups(
        self, batch_id: int, *, after: int = 0, wait_s: float = DEFAULT_WAIT_S, encoding: ArrayEncoding = "b64"
    ) -> Iterator[GroupResult]:
        """Yield a dynamic batch's informative groups, whole, as the farm finds them, until it ends
        (target reached, or the pool spent: ``status(batch_id).dynamic.end_reason`` says which)."""
        while True:
            page = self.groups_page(batch_id, after=after, wait_s=wait_s, encoding=encoding)
            yield from page.items
            after = page.next_cursor
            if not page.items and page.batch_state is not BatchState.RUNNING:
                return

    def pass_rates(self, keys: Sequence[str] | None = None, *, type: str | None = None) -> list[PassRate]:
        """The ledger's pass rates of prompts (``farm.schemas.task_key`` gives a task's key)."""
        params: dict[str, Any] = {"key": list(keys or []), **({"type": type} if type else {})}
        response = _check(self._http.get("/v1/pass-rates", params=params))
        return [PassRate.model_validate(item) for item in response.json()]

    # ---- weight updates ----------------------------------------------------------------------------
    def weights(self) -> WeightsOut:
        """The newest weight version, each backend's, and the update in progress (or the last one)."""
        return _parse(WeightsOut, self._http.get("/v1/weights"))

    def pause(
        self, *, mode: PauseMode = "keep", proxy: Literal["wait", "reject"] = "wait", timeout_s: float = 900.0
    ) -> WeightUpdateOut:
        """Pause every backend for a weight update (see README, "Weight updates"); new turns wait.
        Returns the update: pass its ``id`` to ``load_weights``, ``resume`` or ``rollback``."""
        body = WeightPause(mode=mode, proxy=proxy, timeout_s=timeout_s).model_dump(mode="json")
        return _parse(WeightUpdateOut, self._http.post("/v1/weights/pause", json=body, timeout=CONTROL_TIMEOUT_S))

    def load_weights(self, update_id: int, *, path: str | os.PathLike[str], version: int) -> WeightUpdateOut:
        """Every paused backend loads the checkpoint directory ``path`` (readable where they run)."""
        body = WeightLoad(path=os.fspath(path), version=version).model_dump(mode="json")
        url = f"/v1/weights/updates/{update_id}/load"
        return _parse(WeightUpdateOut, self._http.post(url, json=body, timeout=CONTROL_TIMEOUT_S))

    def resume(self, update_id: int, *, version: int | None = None) -> WeightUpdateOut:
        """Resume at ``version`` (the loaded one if unset)."""
        body = WeightResume(version=version).model_dump(mode="json")
        url = f"/v1/weights/updates/{update_id}/resume"
        return _parse(WeightUpdateOut, self._http.post(url, json=body, timeout=CONTROL_TIMEOUT_S))

    def rollback(self, update_id: int) -> WeightUpdateOut:
        """Give the update up: every backend resumes with the weights it holds."""
        url = f"/v1/weights/updates/{update_id}/rollback"
        return _parse(WeightUpdateOut, self._http.post(url, timeout=CONTROL_TIMEOUT_S))

    def results_page(
        self,
        batch_id: int,
        *,
        after: int = 0,
        page_size: int = DEFAULT_PAGE_SIZE,
        wait_s: float = 0,
        encoding: ResultsEncoding = "binary",
        trajectories: bool = True,
    ) -> ResultsPage:
        """One page of the results stream (see ``results``)."""
        params, headers = _results_request(after, page_size, wait_s, encoding, trajectories)
        url, timeout = f"/v1/batches/{batch_id}/results", self._timeout_s + wait_s
        if self._direct is not None:
            request = self._http.build_request("GET", url, params=params, headers=headers, timeout=timeout)
            answer, body = self._direct.send(request, _body_buffer)
            return _results_page(answer) if body is None else _binary_page(body.data)
        with self._http.stream("GET", url, params=params, headers=headers, timeout=timeout) as response:
            buffer = _body_buffer(response)
            if buffer is None:
                response.read()
                return _results_page(response)
            view, filled = buffer.data, 0
            for chunk in response.iter_bytes():
                filled = _put(view, filled, chunk)
            return _filled_page(view, filled)

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
        ahead: deque[tuple[int, Future[ResultsPage]]] = deque()
        ended = False
        try:
            page = fetch(after, min(page_size, FIRST_PAGE_SIZE))
            while True:
                valid, cursors = _plan_ahead(page, page_size, [cursor for cursor, _ in ahead])
                if not valid:
                    for _, future in ahead:
                        future.cancel()
                    ahead.clear()
                ahead.extend((cursor, pool.submit(fetch, cursor)) for cursor in cursors)
                yield from page.items
                if not ahead:
                    break
                page = ahead.popleft()[1].result()
            ended = True
        finally:
            # A caller that stops early must not wait for a long-poll in flight. At the end nothing
            # is in flight.
            pool.shutdown(wait=ended, cancel_futures=True)

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

    async def handlers(self) -> list[HandlerInfo]:
        """See ``FarmClient.handlers``."""
        return [HandlerInfo.model_validate(h) for h in _check(await self._http.get("/v1/handlers")).json()]

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
        max_staleness: int | None = None,
        on_stale: Literal["rerun", "mark"] = "rerun",
        dynamic: DynamicSampling | Mapping[str, Any] | None = None,
    ) -> BatchCreated:
        headers = {"Idempotency-Key": idempotency_key} if idempotency_key else None
        body = _batch_body(tasks, group_size, sampling, metadata, max_staleness, on_stale, dynamic)
        return _parse(BatchCreated, await self._http.post("/v1/batches", json=body, headers=headers))

    async def overview(self) -> Overview:
        """See ``FarmClient.overview``."""
        return _parse(Overview, await self._http.get("/v1/overview"))

    async def status(self, batch_id: int) -> BatchStatus:
        return _parse(BatchStatus, await self._http.get(f"/v1/batches/{batch_id}"))

    async def cancel(self, batch_id: int) -> BatchStatus:
        return _parse(BatchStatus, await self._http.post(f"/v1/batches/{batch_id}/cancel"))

    async def job(self, job_id: int) -> JobOut:
        return _parse(JobOut, await self._http.get(f"/v1/jobs/{job_id}"))

    async def trajectory(self, job_id: int, *, encoding: ArrayEncoding = "b64") -> TrajectoryOut:
        response = await self._http.get(f"/v1/jobs/{job_id}/trajectory", params={"encoding": encoding})
        return _parse(TrajectoryOut, response)

    async def groups_page(
        self, batch_id: int, *, after: int = 0, limit: int = 16, wait_s: float = 0, encoding: ArrayEncoding = "b64"
    ) -> GroupsPage:
        """See ``FarmClient.groups_page``."""
        params = {"after": after, "limit": limit, "wait_s": wait_s, "encoding": encoding}
        url, timeout = f"/v1/batches/{batch_id}/groups", self._timeout_s + wait_s
        return _parse(GroupsPage, await self._http.get(url, params=params, timeout=timeout))

    async def groups(
        self, batch_id: int, *, after: int = 0, wait_s: float = DEFAULT_WAIT_S, encoding: ArrayEncoding = "b64"
    ) -> AsyncIterator[GroupResult]:
        """See ``FarmClient.groups``."""
        while True:
            page = await self.groups_page(batch_id, after=after, wait_s=wait_s, encoding=encoding)
            for item in page.items:
                yield item
            after = page.next_cursor
            if not page.items and page.batch_state is not BatchState.RUNNING:
                return

    async def pass_rates(self, keys: Sequence[str] | None = None, *, type: str | None = None) -> list[PassRate]:
        """See ``FarmClient.pass_rates``."""
        params: dict[str, Any] = {"key": list(keys or []), **({"type": type} if type else {})}
        response = _check(await self._http.get("/v1/pass-rates", params=params))
        return [PassRate.model_validate(item) for item in response.json()]

    # ---- weight updates ----------------------------------------------------------------------------
    async def weights(self) -> WeightsOut:
        """See ``FarmClient.weights``."""
        return _parse(WeightsOut, await self._http.get("/v1/weights"))

    async def pause(
        self, *, mode: PauseMode = "keep", proxy: Literal["wait", "reject"] = "wait", timeout_s: float = 900.0
    ) -> WeightUpdateOut:
        """Pause every backend for a weight update (see README, "Weight updates"); new turns wait.
        Returns the update: pass its ``id`` to ``load_weights``, ``resume`` or ``rollback``."""
        body = WeightPause(mode=mode, proxy=proxy, timeout_s=timeout_s).model_dump(mode="json")
        return _parse(WeightUpdateOut, await self._http.post("/v1/weights/pause", json=body, timeout=CONTROL_TIMEOUT_S))

    async def load_weights(self, update_id: int, *, path: str | os.PathLike[str], version: int) -> WeightUpdateOut:
        """Every paused backend loads the checkpoint directory ``path`` (readable where they run)."""
        body = WeightLoad(path=os.fspath(path), version=version).model_dump(mode="json")
        url = f"/v1/weights/updates/{update_id}/load"
        return _parse(WeightUpdateOut, await self._http.post(url, json=body, timeout=CONTROL_TIMEOUT_S))

    async def resume(self, update_id: int, *, version: int | None = None) -> WeightUpdateOut:
        """Resume at ``version`` (the loaded one if unset)."""
        body = WeightResume(version=version).model_dump(mode="json")
        url = f"/v1/weights/updates/{update_id}/resume"
        return _parse(WeightUpdateOut, await self._http.post(url, json=body, timeout=CONTROL_TIMEOUT_S))

    async def rollback(self, update_id: int) -> WeightUpdateOut:
        """Give the update up: every backend resumes with the weights it holds."""
        url = f"/v1/weights/updates/{update_id}/rollback"
        return _parse(WeightUpdateOut, await self._http.post(url, timeout=CONTROL_TIMEOUT_S))

    async def results_page(
        self,
        batch_id: int,
        *,
        after: int = 0,
        page_size: int = DEFAULT_PAGE_SIZE,
        wait_s: float = 0,
        encoding: ResultsEncoding = "binary",
        trajectories: bool = True,
    ) -> ResultsPage:
        params, headers = _results_request(after, page_size, wait_s, encoding, trajectories)
        url, timeout = f"/v1/batches/{batch_id}/results", self._timeout_s + wait_s
        async with self._http.stream("GET", url, params=params, headers=headers, timeout=timeout) as response:
            buffer = _body_buffer(response)
            if buffer is None:
                await response.aread()
                return _results_page(response)
            view, filled = buffer.data, 0
            async for chunk in response.aiter_bytes():
                filled = _put(view, filled, chunk)
            return _filled_page(view, filled)

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

        def fetch(cursor: int) -> asyncio.Task[ResultsPage]:
            return asyncio.create_task(
                self.results_page(
                    batch_id,
                    after=cursor,
                    page_size=page_size,
                    wait_s=wait_s,
                    encoding=encoding,
                    trajectories=trajectories,
                )
            )

        ahead: deque[tuple[int, asyncio.Task[ResultsPage]]] = deque()
        try:
            size = min(page_size, FIRST_PAGE_SIZE)
            page = await self.results_page(
                batch_id, after=after, page_size=size, wait_s=wait_s, encoding=encoding, trajectories=trajectories
            )
            while True:
                valid, cursors = _plan_ahead(page, page_size, [cursor for cursor, _ in ahead])
                if not valid:
                    for _, task in ahead:
                        task.cancel()
                    ahead.clear()
                ahead.extend((cursor, fetch(cursor)) for cursor in cursors)
                for item in page.items:
                    yield item
                if not ahead:
                    break
                page = await ahead.popleft()[1]
        finally:
            # A caller that stops early must not leave a long-poll running.
            for _, task in ahead:
                task.cancel()

    async def wait(self, batch_id: int, *, timeout_s: float | None = None, poll_s: float = 0.5) -> BatchStatus:
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        while True:
            status = await self.status(batch_id)
            if status.state is not BatchState.RUNNING:
                return status
            if deadline is not None and time.monotonic() >= deadline:
                raise TimeoutError(f"batch {batch_id} still running after {timeout_s}s: {status.counts}")
            await asyncio.sleep(poll_s)
