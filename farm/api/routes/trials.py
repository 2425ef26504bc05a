"""Trials over HTTP: harness episodes behind the proxy. A trainer (or the harness task type) creates
one, hands its key and base URL to the harness, and reads its token-exact record afterwards. The
trials themselves are ``farm.trials``; these routes only call it and shape its answers."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Path, Query, Request, Response

from farm.api.deps import DB, State
from farm.api.errors import error_responses
from farm.constants import trial_balancer_key
from farm.db.arrays import encode_ids, encode_logprobs, encode_mask
from farm.db.session import transaction
from farm.schemas import (
    TRIAL_ID_PATTERN,
    ArrayEncoding,
    SegmentOut,
    TrialCallOut,
    TrialCreate,
    TrialCreated,
    TrialOut,
    TrialRecord,
)
from farm.trials import record, store

router = APIRouter(prefix="/v1/trials", tags=["trials"])
TrialId = Annotated[str, Path(pattern=TRIAL_ID_PATTERN, description="the trial's id")]


def _out(db: DB, trial_id: str) -> TrialOut:
    trial = store.get(db, trial_id)
    return TrialOut(**record.summary(trial), certificate=[record.certificate(c) for c in store.calls(db, trial_id)])


@router.post(
    "",
    status_code=201,
    operation_id="create_trial",
    response_model=TrialCreated,
    responses=error_responses(404, 409, 413, 422),
    summary="Create a trial: a key and a base URL for one harness episode",
)
def create_trial(body: TrialCreate, state: State, request: Request) -> TrialCreated:
    with transaction(state.sessions) as session:
        trial, key = store.new_trial(
            session,
            trial_id=body.id,
            model=body.model or state.settings.llm.builtin_model_name,
            job_id=body.job_id,
            sampling=body.sampling.model_dump(exclude_none=True),
            meta=body.metadata,
            history=body.history,
        )
        trial_id = trial.id
    base = str(request.base_url).rstrip("/")
    return TrialCreated(
        id=trial_id,
        key=key,
        openai_base_url=f"{base}/proxy/{trial_id}/v1",
        anthropic_base_url=f"{base}/proxy/{trial_id}",
    )


@router.get(
    "/{trial_id}",
    operation_id="get_trial",
    response_model=TrialOut,
    responses=error_responses(404, 422),
    summary="A trial and its continuity certificate",
)
def get_trial(trial_id: TrialId, db: DB) -> TrialOut:
    return _out(db, trial_id)


@router.get(
    "/{trial_id}/calls",
    operation_id="list_trial_calls",
    response_model=list[TrialCallOut],
    responses=error_responses(404, 422),
    summary="A trial's calls: each one's certificate entry and the reply the harness was given",
)
def list_calls(trial_id: TrialId, db: DB) -> list[TrialCallOut]:
    store.get(db, trial_id)
    return [TrialCallOut(**record.certificate(c), reply=c.reply) for c in store.calls(db, trial_id)]


@router.get(
    "/{trial_id}/record",
    operation_id="get_trial_record",
    response_model=TrialRecord,
    responses=error_responses(404, 422),
    summary="A trial's token-exact record: one token sequence per segment",
)
def get_record(
    trial_id: TrialId, db: DB, encoding: Annotated[ArrayEncoding, Query(description="b64 or json arrays")] = "json"
) -> TrialRecord:
    out = _out(db, trial_id)
    segs = [
        SegmentOut(
            index=s.index,
            calls=s.calls,
            num_tokens=len(s.token_ids),
            token_ids=encode_ids(s.token_ids.tobytes(), encoding),
            logprobs=encode_logprobs(s.logprobs.tobytes(), encoding),
            loss_mask=encode_mask(s.loss_mask.tobytes(), encoding),
            spans=s.spans,
            weight_versions=s.weight_versions,
        )
        for s in record.segments(store.calls(db, trial_id))
    ]
    return TrialRecord(**out.model_dump(), encoding=encoding, segment_tokens=segs)


@router.post(
    "/{trial_id}/end",
    operation_id="end_trial",
    response_model=TrialOut,
    responses=error_responses(404, 422),
    summary="End a trial: it takes no more calls, and its backend slot is released",
)
def end_trial(trial_id: TrialId, state: State) -> TrialOut:
    with transaction(state.sessions) as session:
        store.end(session, trial_id)
    state.balancer.release(trial_balancer_key(trial_id))
    with state.sessions() as session:
        return _out(session, trial_id)


@router.delete(
    "/{trial_id}",
    status_code=204,
    operation_id="delete_trial",
    responses=error_responses(404, 422),
    summary="Delete a trial and its record",
)
def delete_trial(trial_id: TrialId, state: State) -> Response:
    with transaction(state.sessions) as session:
        session.delete(store.get(session, trial_id))
    state.balancer.release(trial_balancer_key(trial_id))
    return Response(status_code=204)
