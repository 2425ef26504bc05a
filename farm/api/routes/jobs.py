"""One job with its stage history, and its trajectory."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Query

from farm.api.deps import DB, JobId
from farm.api.errors import error_responses
from farm.db import reads
from farm.schemas import ArrayEncoding, JobOut, TrajectoryOut

router = APIRouter(prefix="/v1/jobs", tags=["jobs"])
ERRORS = error_responses(404, 422)


@router.get("/{job_id}", operation_id="get_job", response_model=JobOut, responses=ERRORS)
def get_job(job_id: JobId, db: DB) -> JobOut:
    return reads.get_job(db, job_id)


@router.get("/{job_id}/trajectory", operation_id="get_trajectory", response_model=TrajectoryOut, responses=ERRORS)
def get_trajectory(
    job_id: JobId, db: DB, encoding: Annotated[ArrayEncoding, Query(description="b64 or json arrays")] = "json"
) -> TrajectoryOut:
    return reads.get_trajectory(db, job_id, encoding)
