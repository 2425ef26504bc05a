"""Submit, watch, read results of, and cancel batches."""

from __future__ import annotations

import asyncio
import time
from datetime import timedelta
from functools import partial
from typing import Annotated, Any

from fastapi import APIRouter, Header, Query, Request, Response
from fastapi.concurrency import run_in_threadpool
from sqlalchemy.orm import Session

from farm.api.binary import BinaryPageResponse, binary_page, wants_binary
from farm.api.deps import DB, BatchId, State
from farm.api.errors import error_responses
from farm.api.metrics import with_tokens
from farm.batches import submit
from farm.constants import BatchState, batch_cancel_key, batch_events_channel
from farm.db import reads
from farm.db.base import utcnow
from farm.db.jobs import lifecycle
from farm.db.session import transaction
from farm.deadlines import tail
from farm.schemas import (
    RESULTS_MEDIA_TYPE,
    ArrayEncoding,
    BatchCreate,
    BatchCreated,
    BatchStatus,
    BatchTail,
    GroupsPage,
    ResultsPage,
)
from farm.worker.enqueue import revoke, send_init_many

router = APIRouter(prefix="/v1/batches", tags=["batches"])

#: how long the cancel flag lives in Redis; the database keeps the cancel for good.
CANCEL_FLAG_TTL_S = 7 * 24 * 3600
#: finish positions are 32-bit in the database (a batch holds far fewer jobs): no cursor goes past.
MAX_CURSOR = 2**31 - 1
#: what the routes on one batch answer besides their success (401 and 503: see ``create_app``).
ERRORS = error_responses(404, 422)

#: the results page depends on the Accept header (JSON or binary), so caches must key on it.
_VARY = {"Vary": "Accept"}

#: OpenAPI links from a submitted batch to the routes that read it, so a client generator (or the
#: stateful phase of a fuzzer) can follow ``id`` and ``job_ids`` from the answer.
_BATCH = {"batch_id": "$response.body#/id"}
_JOB = {"job_id": "$response.body#/job_ids/0"}
BATCH_LINKS: dict[str, Any] = {
    "GetBatch": {"operationId": "get_batch", "parameters": _BATCH, "description": "the batch's status"},
    "GetResults": {"operationId": "get_results", "parameters": _BATCH, "description": "its finished jobs"},
    "CancelBatch": {"operationId": "cancel_batch", "parameters": _BATCH, "description": "cancel it"},
    "GetJob": {"operationId": "get_job", "parameters": _JOB, "description": "its first job"},
    "GetTrajectory": {"operationId": "get_trajectory", "parameters": _JOB, "description": "that job's trajectory"},
}


@router.post(
    "",
    status_code=201,
    response_model=BatchCreated,
    operation_id="submit_batch",
    responses={
        201: {"links": BATCH_LINKS},
        200: {"model": BatchCreated, "description": "returned for an idempotent resubmit", "links": BATCH_LINKS},
        **error_responses(409, 413, 422),
    },
    summary="Submit a batch: each task becomes a group of group_size jobs",
)
def submit_batch(
    request: BatchCreate,
    state: State,
    response: Response,
    idempotency_key: Annotated[
        str | None,
        Header(max_length=200, description="resubmitting with the same key returns the same batch"),
    ] = None,
) -> BatchCreated:
    out = submit.submit_batch(
        state.sessions, state.settings, request, key=idempotency_key, send=partial(send_init_many, state.celery)
    )
    if not out.created:
        response.status_code = 200
    return out


@router.get(
    "/{batch_id}",
    operation_id="get_batch",
    response_model=BatchStatus,
    responses=ERRORS,
    summary="Batch status with counts",
)
def get_batch(batch_id: BatchId, state: State, db: DB) -> BatchStatus:
    return with_tokens(state, reads.batch_status(db, batch_id))


#: the binary page as the spec describes it (the JSON page is ``ResultsPage``).
_BINARY_PAGE = {
    "description": (
        f"The page as JSON; or, when `Accept` names `{RESULTS_MEDIA_TYPE}` (with a q above 0 and at least the "
        "q of JSON), binary: the same page with the arrays as raw little-endian bytes (`encoding` does not "
        "apply). Binary layout: 4 bytes `FRP1`; H, the header's length, as a uint32 LE; H bytes of UTF-8 JSON, "
        "the JSON page with each trajectory's `encoding` `binary` and its token_ids, logprobs and loss_mask as "
        "{dtype, offset, length} (padded with spaces to end on a multiple of 8); then the arrays, each `offset` "
        "bytes after the header, at multiples of 8."
    ),
    "content": {RESULTS_MEDIA_TYPE: {"schema": {"type": "string", "format": "binary"}}},
}


@router.get(
    "/{batch_id}/results",
    operation_id="get_results",
    response_model=ResultsPage,
    responses={200: _BINARY_PAGE, **ERRORS},
    summary="Finished jobs in finish order, long-polling until at least one is past the cursor",
)
async def get_results(
    batch_id: BatchId,
    state: State,
    request: Request,
    after: Annotated[int, Query(ge=0, le=MAX_CURSOR, description="the last `seq` you have; 0 to start")] = 0,
    limit: Annotated[int, Query(ge=1, le=1000)] = 100,
    wait_s: Annotated[
        float, Query(ge=0, allow_inf_nan=False, description="hold the request up to this long for a result")
    ] = 0,
    encoding: Annotated[ArrayEncoding, Query(description="b64: compact arrays; json: plain lists")] = "b64",
    trajectories: Annotated[bool, Query(description="include trajectories of done jobs")] = True,
    until_ready: Annotated[
        bool,
        Query(description="a batch with a quorum: answer at once once it is ready and `after` reached its ready_seq"),
    ] = False,
) -> Response:
    deadline = time.monotonic() + min(wait_s, state.settings.api.max_wait_s)
    binary = wants_binary(request.headers.get("accept"))

    def read(session: Session) -> Response:
        if binary:
            rows = reads.results_rows(session, batch_id, after=after, limit=limit, trajectories=trajectories)
            return BinaryPageResponse(binary_page(rows, after=after), headers=_VARY)
        page = reads.results_page(
            session, batch_id, after=after, limit=limit, encoding=encoding, trajectories=trajectories
        )
        # Serialised by pydantic-core directly: pages of trajectories run to tens of MB, and
        # FastAPI's generic path would validate and encode them again in Python.
        return Response(page.model_dump_json(), media_type="application/json", headers=_VARY)

    def answer(lingered: bool) -> Response | int:
        """The page, if it is worth sending now; else how many results are past the cursor."""
        with state.sessions() as session:
            # Reads only, each one statement: outside a transaction they cost no BEGIN and ROLLBACK
            # round trips (on PostgreSQL the page is one statement; see reads.results_rows).
            session.connection(execution_options={"isolation_level": "AUTOCOMMIT"})
            if time.monotonic() < deadline:
                # Finish positions are dense (1..finished_jobs), so the batch row alone says how
                # many results are past the cursor: no page is read until it is worth sending.
                batch = reads.get_batch(session, batch_id)
                waiting = batch.finished_jobs - after
                step_read = until_ready and batch.ready_seq is not None and after >= batch.ready_seq
                if (
                    waiting < limit
                    and batch.state is BatchState.RUNNING
                    and not (waiting > 0 and lingered)
                    and not step_read
                ):
                    return waiting
            return read(session)

    lingered = False
    while True:
        event = state.notifier.event(batch_id)
        outcome = await run_in_threadpool(answer, lingered)
        if isinstance(outcome, Response):
            return outcome
        left = deadline - time.monotonic()
        if outcome > 0:
            # Results finish in bursts and trickles: a moment's wait turns them into one page
            # instead of one request and one query per job (a client streaming a running batch
            # asks again as soon as it has a page, so most pages would hold one or two results).
            await asyncio.sleep(max(0.0, min(state.settings.api.results_linger_s, left)))
            lingered = True
        else:
            await state.notifier.wait(event, left)


@router.get(
    "/{batch_id}/tail",
    operation_id="get_batch_tail",
    response_model=BatchTail,
    responses=ERRORS,
    summary="Time to 50/90/99/100% of the batch, its readiness, and what was carried or cut by task",
)
def get_batch_tail(batch_id: BatchId, db: DB) -> BatchTail:
    return tail.batch_tail(db, batch_id)


@router.get(
    "/{batch_id}/groups",
    operation_id="get_groups",
    response_model=GroupsPage,
    responses=error_responses(404, 409, 422),
    summary="A dynamic batch's informative groups as they are found, long-polling until one is past the cursor",
)
async def get_groups(
    batch_id: BatchId,
    state: State,
    after: Annotated[int, Query(ge=0, le=MAX_CURSOR, description="the last group `seq` you have; 0 to start")] = 0,
    limit: Annotated[int, Query(ge=1, le=1000)] = 16,
    wait_s: Annotated[
        float, Query(ge=0, allow_inf_nan=False, description="hold the request up to this long for a group")
    ] = 0,
    encoding: Annotated[ArrayEncoding, Query(description="b64: compact arrays; json: plain lists")] = "b64",
) -> Response:
    """Every informative group of a dynamic batch once, whole (every sample's result and the rewards'
    spread), in the order the farm found them. Groups that were not informative, and jobs stopped
    when the target was reached, are never here."""
    deadline = time.monotonic() + min(wait_s, state.settings.api.max_wait_s)

    def answer() -> Response | None:
        with state.sessions() as session:
            batch = reads.get_batch(session, batch_id)
            ready = batch.groups_informative > after or batch.state is not BatchState.RUNNING
            if not ready and time.monotonic() < deadline:
                return None
            page = reads.groups_page(session, batch_id, after=after, limit=limit, encoding=encoding)
            return Response(page.model_dump_json(), media_type="application/json")

    while True:
        event = state.notifier.event(batch_id)
        outcome = await run_in_threadpool(answer)
        if outcome is not None:
            return outcome
        await state.notifier.wait(event, deadline - time.monotonic())


@router.post(
    "/{batch_id}/cancel",
    operation_id="cancel_batch",
    response_model=BatchStatus,
    responses=ERRORS,
    summary="Cancel a batch",
)
def cancel_batch(batch_id: BatchId, state: State) -> BatchStatus:
    """Queued jobs are revoked; running stages stop at their next turn or stage boundary.

    Cancelling a finished batch changes nothing and returns its status."""
    with transaction(state.sessions) as session:
        reads.get_batch(session, batch_id)
        now = utcnow()
        task_ids = lifecycle.cancel_batch(
            session.connection(),
            batch_id=batch_id,
            now=now,
            teardown_due=now + timedelta(seconds=state.settings.worker.lease_s),
        )
    state.redis.set(batch_cancel_key(batch_id), 1, ex=CANCEL_FLAG_TTL_S)
    revoke(state.celery, task_ids)
    state.redis.publish(batch_events_channel(batch_id), "cancelled")
    with state.sessions() as session:
        return reads.batch_status(session, batch_id)
