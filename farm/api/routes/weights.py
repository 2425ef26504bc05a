"""Weight updates between training steps: pause the backends, load new weights, resume at a new version."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Path, Request

from farm.api.deps import MAX_ID
from farm.api.errors import error_responses
from farm.schemas import WeightLoad, WeightPause, WeightResume, WeightsOut, WeightUpdateOut
from farm.weights.coordinator import WeightUpdater

router = APIRouter(prefix="/v1/weights", tags=["weights"])
UpdateId = Annotated[int, Path(ge=1, le=MAX_ID, description="a weight update id, as the pause returned it")]
ERRORS = error_responses(404, 409, 422, 502)
_UPDATE = {"update_id": "$response.body#/id"}
UPDATE_LINKS = {
    name: {"operationId": op, "parameters": _UPDATE, "description": what}
    for name, op, what in (
        ("GetWeightUpdate", "get_weight_update", "the update"),
        ("LoadWeights", "load_weights", "load new weights"),
        ("ResumeWeights", "resume_weights", "resume at the new version"),
        ("RollbackWeights", "rollback_weights", "resume on the old weights"),
    )
}


def _updater(request: Request) -> WeightUpdater:
    updater: WeightUpdater = request.app.state.weights
    return updater


@router.get("", operation_id="get_weights", response_model=WeightsOut, summary="Weight versions and the update")
def get_weights(request: Request) -> WeightsOut:
    return _updater(request).status()


@router.post(
    "/pause",
    status_code=201,
    operation_id="pause_backends",
    response_model=WeightUpdateOut,
    responses={201: {"links": UPDATE_LINKS}, **error_responses(409, 413, 422, 502)},
    summary="Pause every healthy backend for a weight update; new turns wait until resume",
)
def pause(body: WeightPause, request: Request) -> WeightUpdateOut:
    return _updater(request).pause(mode=body.mode, proxy=body.proxy, timeout_s=body.timeout_s)


@router.get("/updates/{update_id}", operation_id="get_weight_update", response_model=WeightUpdateOut, responses=ERRORS)
def get_update(update_id: UpdateId, request: Request) -> WeightUpdateOut:
    return _updater(request).get(update_id)


@router.post(
    "/updates/{update_id}/load",
    operation_id="load_weights",
    response_model=WeightUpdateOut,
    responses=error_responses(404, 409, 413, 422, 502),
    summary="Every paused backend loads the weights in a directory it can read",
)
def load(update_id: UpdateId, body: WeightLoad, request: Request) -> WeightUpdateOut:
    return _updater(request).load(update_id, path=body.path, version=body.version)


@router.post(
    "/updates/{update_id}/resume",
    operation_id="resume_weights",
    response_model=WeightUpdateOut,
    responses=error_responses(404, 409, 413, 422, 502),
    summary="Resume the backends at the new version",
)
def resume(update_id: UpdateId, body: WeightResume, request: Request) -> WeightUpdateOut:
    return _updater(request).resume(update_id, version=body.version)


@router.post(
    "/updates/{update_id}/rollback",
    operation_id="rollback_weights",
    response_model=WeightUpdateOut,
    responses=ERRORS,
    summary="Give up the update: every backend resumes with the weights it holds",
)
def rollback(update_id: UpdateId, request: Request) -> WeightUpdateOut:
    return _updater(request).rollback(update_id)
