"""What ``FarmClient`` and ``AsyncFarmClient`` share, as httpx's ``BaseClient`` is to its two
clients: every request is built here (method, URL, params, body, headers, timeout) and every answer
read here (error mapping, models), along with the cursor of the results stream and the polling of
``wait``. The two clients in ``farm.client.client`` only send, one blocking and one awaiting.

Any error answer raises an ``ApiError(status, code, detail)`` that is also the farm error class of
its code (``except NotFound``, ``except InvalidSpec``; see ``farm.errors.HTTP_ERRORS``).
"""

from __future__ import annotations

import functools
import os
import time
import uuid
from collections import deque
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Generic, Literal, TypeVar

import httpx
from pydantic import BaseModel, ValidationError

from farm.client.binary import BINARY_ACCEPT, decode_page, is_binary
from farm.client.retry import RetryPolicy
from farm.constants import DEFAULT_DATA_DIR, TOKEN_FILE_NAME, BatchState
from farm.errors import api_error
from farm.schemas import (
    ArrayEncoding,
    BatchCreate,
    BatchCreated,
    BatchLimits,
    BatchStatus,
    BatchTail,
    DynamicSampling,
    GroupsPage,
    HandlerInfo,
    Health,
    JobOut,
    Overview,
    PassRate,
    PauseMode,
    Quorum,
    ResultsPage,
    SamplingParams,
    TaskSet,
    TaskSpec,
    TrajectoryOut,
    TrialCreate,
    TrialCreated,
    TrialOut,
    TrialRecord,
    WeightLoad,
    WeightPause,
    WeightResume,
    WeightsOut,
    WeightUpdateOut,
)
from farm.schemas.trials import DEFAULT_HISTORY, TrialHistory, TrialSampling

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

T = TypeVar("T")
M = TypeVar("M", bound=BaseModel)
#: the httpx client a farm client sends with.
H = TypeVar("H", httpx.Client, httpx.AsyncClient)
#: a results page requested ahead: a thread's Future or an asyncio Task.
P = TypeVar("P")


def check(response: httpx.Response) -> httpx.Response:
    """``response`` if it is a success.

    Raises:
        ApiError: an error answer, as the farm error class of its code.
    """
    if response.is_success:
        return response
    field, errors = None, None
    try:
        body = response.json()
        code, detail, field = body.get("code", "http_error"), body.get("detail", response.text), body.get("field")
        # Every problem of a refused request (a 422 lists them all), each a {field, detail}.
        listed = body.get("errors")
        if isinstance(listed, list):
            errors = [
                {"field": str(item.get("field") or ""), "detail": str(item.get("detail", ""))}
                for item in listed
                if isinstance(item, dict)
            ]
    except (ValueError, AttributeError):
        code, detail = "http_error", response.text or response.reason_phrase
    raise api_error(response.status_code, code, str(detail), field, errors)


def _model(model: type[M], response: httpx.Response) -> M:
    return model.model_validate_json(check(response).content)


def _models(model: type[M], response: httpx.Response) -> list[M]:
    return [model.model_validate(item) for item in check(response).json()]


def _no_content(response: httpx.Response) -> None:
    check(response)


def read_results_page(response: httpx.Response) -> ResultsPage:
    """A results page as the server chose to send it, binary or JSON (the body read already).

    Raises:
        ApiError: an error answer, or a binary page that is not one.
    """
    check(response)
    if is_binary(response):
        return decode_page(response.content)
    return ResultsPage.model_validate_json(response.content)


@dataclass(frozen=True)
class Call(Generic[T]):
    """One API call, built: the request to send, and how its answer reads."""

    request: httpx.Request
    read: Callable[[httpx.Response], T]


def _batch_body(
    tasks: Sequence[TaskSpec | Mapping[str, Any]],
    group_size: int,
    sampling: SamplingParams | Mapping[str, Any] | None,
    metadata: Mapping[str, Any] | None,
    max_staleness: int | None,
    on_stale: Literal["rerun", "mark"],
    dynamic: DynamicSampling | Mapping[str, Any] | None,
    history: TrialHistory | None = None,
    limits: BatchLimits | Mapping[str, Any] | None = None,
    quorum: Quorum | Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    given = {
        "tasks": list(tasks),
        "group_size": group_size,
        "sampling": sampling if sampling is not None else {},
        "metadata": dict(metadata or {}),
        "max_staleness": max_staleness,
        "on_stale": on_stale,
        "dynamic": dynamic,
        "history": history if history is not None else DEFAULT_HISTORY,
        "limits": limits,
        "quorum": quorum,
    }
    try:
        request = BatchCreate.model_validate(given)
    except ValidationError as exc:
        raise _invalid(exc) from None
    body = request.model_dump(mode="json", exclude_none=False)
    # The sampling fields the trainer set, not the defaults: a harness job overrides only those.
    body["sampling"] = request.sampling.model_dump(mode="json", exclude_unset=True)
    # Options left unset stay out of the body: one any farm version takes.
    if max_staleness is None:
        del body["max_staleness"], body["on_stale"]
    if dynamic is None:
        del body["dynamic"]
    if history is None:
        del body["history"]
    for name, given_value in (("limits", limits), ("quorum", quorum)):
        if given_value is None:
            del body[name]
        else:
            body[name] = {k: v for k, v in body[name].items() if v is not None}
    return body


def proxy_base_urls(proxy_url: str, trial_id: str) -> tuple[str, str]:
    """The OpenAI and Anthropic base URLs of trial ``trial_id`` on the proxy at ``proxy_url`` (the
    API's own address, whose mounted proxy serves trials, or a ``farm proxy`` process's): both serve
    ``/proxy/{trial}/v1`` (docs/proxy.md#serving-the-api-process-and-farm-proxy)."""
    root = f"{proxy_url.rstrip('/')}/proxy/{trial_id}"
    return f"{root}/v1", root


def _trial_created(proxy_url: str | None, response: httpx.Response) -> TrialCreated:
    """The API names its own proxy in the base URLs; a client given ``proxy_url`` names that one."""
    created = _model(TrialCreated, response)
    if proxy_url is None:
        return created
    openai_url, anthropic_url = proxy_base_urls(proxy_url, created.id)
    return created.model_copy(update={"openai_base_url": openai_url, "anthropic_base_url": anthropic_url})


def _trial_body(
    trial_id: str | None,
    history: TrialHistory | None,
    sampling: TrialSampling | Mapping[str, Any] | None,
    job_id: int | None,
    model: str | None,
    metadata: Mapping[str, Any] | None,
) -> dict[str, Any]:
    given: dict[str, Any] = {
        "id": trial_id,
        "job_id": job_id,
        "model": model,
        "sampling": sampling if sampling is not None else {},
        "metadata": dict(metadata or {}),
        "history": history if history is not None else DEFAULT_HISTORY,
    }
    try:
        request = TrialCreate.model_validate(given)
    except ValidationError as exc:
        raise _invalid(exc) from None
    body = request.model_dump(mode="json", exclude_none=True)
    body["sampling"] = request.sampling.model_dump(mode="json", exclude_none=True)
    if history is None:
        # Unset stays out of the body: the farm's default, whatever it is.
        del body["history"]
    return body


def _invalid(exc: ValidationError) -> Exception:
    """The API's own answer to a request refused here, so one ``except ApiError`` serves both."""
    first = exc.errors()[0]
    field = ".".join(str(p) for p in first["loc"]) or None
    more = f" (and {exc.error_count() - 1} more)" if exc.error_count() > 1 else ""
    return api_error(422, "invalid_request", f"{field}: {first['msg']}{more}", field)


def auth_headers(token: str | None) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"} if token else {}


class _CliToken:
    def __repr__(self) -> str:
        return "CLI_TOKEN"


#: ``token=`` left out: the token the ``farm`` command would send (see ``cli_token``).
CLI_TOKEN: Any = _CliToken()


def cli_token() -> str | None:
    """The token the ``farm`` command sends: ``FARM_API__TOKEN``, else the token file of
    ``FARM_DATA_DIR`` (by default ``~/.rollout-farm/token``, which ``farm up`` writes), else none.

    The client's one look at the environment, made only when ``token=`` is left out (as httpx's
    ``trust_env``): a client-only install has no ``farm.config`` to ask."""
    if token := os.environ.get("FARM_API__TOKEN"):
        return token
    data_dir = Path(os.environ["FARM_DATA_DIR"]) if os.environ.get("FARM_DATA_DIR") else DEFAULT_DATA_DIR
    try:
        return (data_dir / TOKEN_FILE_NAME).read_text().strip() or None
    except OSError:
        return None


def chosen_token(token: str | None) -> str | None:
    return cli_token() if token is CLI_TOKEN else token


def naming_url(exc: httpx.TransportError, request: httpx.Request) -> httpx.TransportError:
    """The same failure, its message naming the URL the call could not reach (httpx's says only
    ``[Errno 111] Connection refused``)."""
    url = request.url.copy_with(query=None)
    named = type(exc)(f"cannot reach the farm API at {url}: {exc or type(exc).__name__}", request=request)
    named.__cause__ = exc
    return named


class BaseFarmClient(Generic[H]):
    """The farm's HTTP API, built and read; a subclass sends each ``Call`` with its ``H``."""

    def __init__(self, http: H, *, timeout_s: float, retry: RetryPolicy, proxy_url: str | None = None) -> None:
        self._http: H = http
        self._timeout_s = timeout_s
        self._retry = retry
        self._proxy_url = proxy_url

    def _call(
        self,
        method: str,
        url: str,
        read: Callable[[httpx.Response], T],
        *,
        params: Mapping[str, Any] | None = None,
        json: Any = None,
        headers: Mapping[str, str] | None = None,
        timeout_s: float | None = None,
    ) -> Call[T]:
        """``timeout_s``: the client's unless given."""
        timeout = self._timeout_s if timeout_s is None else timeout_s
        request = self._http.build_request(method, url, params=params, json=json, headers=headers, timeout=timeout)
        return Call(request, read)

    def _build_health(self) -> Call[Health]:
        return self._call("GET", "/readyz", functools.partial(_model, Health))

    def _build_handlers(self) -> Call[list[HandlerInfo]]:
        return self._call("GET", "/v1/handlers", functools.partial(_models, HandlerInfo))

    def _build_tasks(self, type: str | None) -> Call[list[TaskSet]]:
        return self._call(
            "GET", "/v1/tasks", functools.partial(_models, TaskSet), params={"type": type} if type else None
        )

    def _build_submit(
        self,
        tasks: Sequence[TaskSpec | Mapping[str, Any]],
        *,
        group_size: int,
        sampling: SamplingParams | Mapping[str, Any] | None,
        metadata: Mapping[str, Any] | None,
        idempotency_key: str | None,
        max_staleness: int | None,
        on_stale: Literal["rerun", "mark"],
        dynamic: DynamicSampling | Mapping[str, Any] | None,
        history: TrialHistory | None = None,
        limits: BatchLimits | Mapping[str, Any] | None = None,
        quorum: Quorum | Mapping[str, Any] | None = None,
    ) -> Call[BatchCreated]:
        """A batch's submission, checked as the API checks it.

        Raises:
            InvalidSpec: a batch the API would refuse, refused before it is sent.
        """
        # A key of its own when the caller gives none: a submit sent again after its answer was lost
        # (the API restarting, a connection reset) answers with the batch the first one made.
        headers = {"Idempotency-Key": idempotency_key or f"client-{uuid.uuid4().hex}"}
        body = _batch_body(
            tasks, group_size, sampling, metadata, max_staleness, on_stale, dynamic, history, limits, quorum
        )
        return self._call("POST", "/v1/batches", functools.partial(_model, BatchCreated), json=body, headers=headers)

    def _build_overview(self) -> Call[Overview]:
        return self._call("GET", "/v1/overview", functools.partial(_model, Overview))

    def _build_status(self, batch_id: int) -> Call[BatchStatus]:
        return self._call("GET", f"/v1/batches/{batch_id}", functools.partial(_model, BatchStatus))

    def _build_tail(self, batch_id: int) -> Call[BatchTail]:
        return self._call("GET", f"/v1/batches/{batch_id}/tail", functools.partial(_model, BatchTail))

    def _build_cancel(self, batch_id: int) -> Call[BatchStatus]:
        return self._call("POST", f"/v1/batches/{batch_id}/cancel", functools.partial(_model, BatchStatus))

    def _build_job(self, job_id: int) -> Call[JobOut]:
        return self._call("GET", f"/v1/jobs/{job_id}", functools.partial(_model, JobOut))

    def _build_trajectory(self, job_id: int, encoding: ArrayEncoding) -> Call[TrajectoryOut]:
        read = functools.partial(_model, TrajectoryOut)
        return self._call("GET", f"/v1/jobs/{job_id}/trajectory", read, params={"encoding": encoding})

    def _build_groups_page(
        self, batch_id: int, *, after: int, limit: int, wait_s: float, encoding: ArrayEncoding
    ) -> Call[GroupsPage]:
        params = {"after": after, "limit": limit, "wait_s": wait_s, "encoding": encoding}
        read = functools.partial(_model, GroupsPage)
        return self._call("GET", f"/v1/batches/{batch_id}/groups", read, params=params, timeout_s=self._long(wait_s))

    def _build_pass_rates(self, keys: Sequence[str] | None, type: str | None) -> Call[list[PassRate]]:
        params: dict[str, Any] = {"key": list(keys or []), **({"type": type} if type else {})}
        return self._call("GET", "/v1/pass-rates", functools.partial(_models, PassRate), params=params)

    def _build_weights(self) -> Call[WeightsOut]:
        return self._call("GET", "/v1/weights", functools.partial(_model, WeightsOut))

    def _build_pause(
        self, mode: PauseMode, proxy: Literal["wait", "reject"], timeout_s: float
    ) -> Call[WeightUpdateOut]:
        body = WeightPause(mode=mode, proxy=proxy, timeout_s=timeout_s).model_dump(mode="json")
        return self._control("/v1/weights/pause", body)

    def _build_load_weights(self, update_id: int, path: str | os.PathLike[str], version: int) -> Call[WeightUpdateOut]:
        body = WeightLoad(path=os.fspath(path), version=version).model_dump(mode="json")
        return self._control(f"/v1/weights/updates/{update_id}/load", body)

    def _build_resume(self, update_id: int, version: int | None) -> Call[WeightUpdateOut]:
        body = WeightResume(version=version).model_dump(mode="json")
        return self._control(f"/v1/weights/updates/{update_id}/resume", body)

    def _build_rollback(self, update_id: int) -> Call[WeightUpdateOut]:
        return self._control(f"/v1/weights/updates/{update_id}/rollback", None)

    def _build_results_page(
        self,
        batch_id: int,
        *,
        after: int,
        page_size: int,
        wait_s: float,
        encoding: ResultsEncoding,
        trajectories: bool,
        until_ready: bool = False,
    ) -> httpx.Request:
        """A results page's request; its answer, binary or JSON, is read by ``read_results_page``
        (or read into a buffer first: ``farm.client.binary``)."""
        params = {
            "after": after,
            "limit": page_size,
            "wait_s": wait_s,
            "encoding": "b64" if encoding == "binary" else encoding,
            "trajectories": trajectories,
        }
        if until_ready:  # only when asked: a farm of an earlier release takes the request as it was
            params["until_ready"] = True
        headers = {"Accept": BINARY_ACCEPT} if encoding == "binary" else None
        url, timeout = f"/v1/batches/{batch_id}/results", self._long(wait_s)
        return self._http.build_request("GET", url, params=params, headers=headers, timeout=timeout)

    def _build_create_trial(
        self,
        trial_id: str | None,
        *,
        history: TrialHistory | None,
        sampling: TrialSampling | Mapping[str, Any] | None,
        job_id: int | None,
        model: str | None,
        metadata: Mapping[str, Any] | None,
    ) -> Call[TrialCreated]:
        """A trial's creation, checked as the API checks it.

        Raises:
            InvalidSpec: a trial the API would refuse, refused before it is sent.
        """
        body = _trial_body(trial_id, history, sampling, job_id, model, metadata)
        read = functools.partial(_trial_created, self._proxy_url)
        return self._call("POST", "/v1/trials", read, json=body)

    def _build_trial(self, trial_id: str) -> Call[TrialOut]:
        return self._call("GET", f"/v1/trials/{trial_id}", functools.partial(_model, TrialOut))

    def _build_end_trial(self, trial_id: str) -> Call[TrialOut]:
        return self._call("POST", f"/v1/trials/{trial_id}/end", functools.partial(_model, TrialOut))

    def _build_trial_record(self, trial_id: str, encoding: ArrayEncoding) -> Call[TrialRecord]:
        read = functools.partial(_model, TrialRecord)
        return self._call("GET", f"/v1/trials/{trial_id}/record", read, params={"encoding": encoding})

    def _build_delete_trial(self, trial_id: str) -> Call[None]:
        return self._call("DELETE", f"/v1/trials/{trial_id}", _no_content)

    def _control(self, url: str, body: dict[str, Any] | None) -> Call[WeightUpdateOut]:
        read = functools.partial(_model, WeightUpdateOut)
        return self._call("POST", url, read, json=body, timeout_s=CONTROL_TIMEOUT_S)

    def _long(self, wait_s: float) -> float:
        """A long-poll's timeout: the server holds it for ``wait_s`` on top."""
        return self._timeout_s + wait_s


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


class PagesAhead(Generic[P]):
    """The cursor of a results stream: the pages requested ahead of the one the caller reads, each
    a ``P`` that ``request(cursor)`` starts (a thread's Future, an asyncio Task) and ``cancel`` drops.
    The stream's first page holds at most ``first_size`` results."""

    def __init__(self, page_size: int, request: Callable[[int], P], cancel: Callable[[P], object]) -> None:
        self.first_size = min(page_size, FIRST_PAGE_SIZE)
        self._page_size = page_size
        self._request, self._cancel = request, cancel
        self._ahead: deque[tuple[int, P]] = deque()

    def plan(self, page: ResultsPage) -> bool:
        """After reading ``page``: drop the pages requested ahead if they are not the right ones,
        request the next. Returns whether a page is in flight (False: the stream ends with ``page``)."""
        valid, cursors = _plan_ahead(page, self._page_size, [cursor for cursor, _ in self._ahead])
        if not valid:
            self.cancel()
        self._ahead.extend((cursor, self._request(cursor)) for cursor in cursors)
        return bool(self._ahead)

    def next(self) -> P:
        """The next page in flight (``plan`` said there is one)."""
        return self._ahead.popleft()[1]

    def cancel(self) -> None:
        for _, pending in self._ahead:
            self._cancel(pending)
        self._ahead.clear()


def groups_end(page: GroupsPage) -> bool:
    """Whether a dynamic batch's groups stream ends with ``page``."""
    return not page.items and page.batch_state is not BatchState.RUNNING


class Waiting:
    """``wait``'s polling of one batch: over once it no longer runs, or ``timeout_s`` (None: never)."""

    def __init__(self, batch_id: int, timeout_s: float | None) -> None:
        self._batch_id, self._timeout_s = batch_id, timeout_s
        self._deadline = None if timeout_s is None else time.monotonic() + timeout_s

    def over(self, status: BatchStatus) -> bool:
        """Whether the wait ends with ``status``.

        Raises:
            TimeoutError: the batch still runs past the deadline.
        """
        if status.state is not BatchState.RUNNING:
            return True
        if self._deadline is not None and time.monotonic() >= self._deadline:
            raise TimeoutError(f"batch {self._batch_id} still running after {self._timeout_s}s: {status.counts}")
        return False
