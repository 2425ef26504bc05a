"""The farm as a whole: its health, the overview ``farm status`` shows, and the one error body."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, Field

from farm.constants import Stage
from farm.schemas.backends import BackendOut
from farm.schemas.batches import BatchStatus


class FieldProblem(BaseModel):
    """One thing wrong with a request: where, and what."""

    field: str = Field(description="a dotted path into the request body, e.g. tasks.0.config.problem_id")
    detail: str


class ErrorOut(BaseModel):
    """Every error answer has this shape: ``field`` and ``detail`` say the first problem, ``errors``
    (on a 422) every problem found, so a request is fixed in one round."""

    code: str
    detail: str
    field: str | None = None
    errors: list[FieldProblem] | None = Field(default=None, description="every problem found (422 answers)")


class Health(BaseModel):
    status: Literal["ok", "unavailable"]
    checks: dict[str, str] = Field(default_factory=dict)
    version: str


class WorkerOut(BaseModel):
    name: str = Field(description="the Celery hostname, `<stages>@<node>`")
    node: str
    stages: list[Stage]
    slots: int = Field(description="stages it runs at once")
    pid: int
    db_connections: int = Field(default=0, description="the most database connections its pools may open (0: not said)")


class DatabaseOut(BaseModel):
    """PostgreSQL's connections: what the farm may open against what the server takes."""

    budget: int = Field(description="the most the worker processes heard from lately and this API process may open")
    in_use: int = Field(description="connections to the farm's database now, the farm's and any other client's")
    max_connections: int = Field(description="the server's max_connections (a few are kept for superusers)")


class QueueOut(BaseModel):
    name: str
    stage: Stage
    node: str | None = Field(description="RUN and EVAL queues belong to a node; INIT is shared")
    length: int = Field(description="messages waiting")


class Overview(BaseModel):
    """The farm at a glance (``farm status``): pools, queues, backends, the batches running."""

    workers: list[WorkerOut] = Field(description="worker processes heard from lately")
    queues: list[QueueOut]
    backends: list[BackendOut]
    sandboxes: dict[str, int] = Field(description="live sandboxes per node")
    batches: list[BatchStatus] = Field(description="running batches, newest first (at most 20)")
    database: DatabaseOut | None = Field(default=None, description="PostgreSQL's connections (none on SQLite)")
