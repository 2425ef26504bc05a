"""Weight updates between training steps: the trainer's pause, load and resume, and the update's record."""

from __future__ import annotations

from datetime import datetime
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from farm.constants import PauseOutcome
from farm.schemas.stored import StoredStr, WholeInt

PauseMode = Literal["wait", "keep", "abort"]


class WeightPause(BaseModel):
    """Pause every healthy backend for a weight update."""

    model_config = ConfigDict(extra="forbid")

    mode: PauseMode = Field(
        default="keep",
        description="wait: in-flight turns finish first; keep: they freeze and continue after resume (on the "
        "new weights); abort: they stop and the farm sends each again after resume (the agent never sees it)",
    )
    proxy: Literal["wait", "reject"] = Field(
        default="wait",
        description="harness calls through the proxy while paused: wait for resume, or get a retryable 503",
    )
    timeout_s: float = Field(
        default=900.0,
        gt=0,
        le=86_400,
        description="the farm rolls the update back if it is neither resumed nor rolled back by then",
    )


class WeightLoad(BaseModel):
    """Have every paused backend load new weights from a directory it can read."""

    model_config = ConfigDict(extra="forbid")

    path: StoredStr = Field(min_length=1, max_length=4096, description="a checkpoint directory (safetensors + config)")
    version: WholeInt = Field(ge=0, le=2**31 - 1, description="the version these weights are")


class WeightResume(BaseModel):
    """Resume the backends, serving ``version`` (the loaded one if unset)."""

    model_config = ConfigDict(extra="forbid")

    version: WholeInt | None = Field(
        default=None,
        ge=0,
        le=2**31 - 1,
        description="the weights the backends now hold (required when the trainer loaded them itself)",
    )


class WeightUpdateBackendOut(BaseModel):
    id: str
    version: int = Field(description="the version of the weights it holds")
    paused_at: datetime | None
    loaded_at: datetime | None
    resumed_at: datetime | None
    pause_outcome: PauseOutcome | None = Field(
        description="how its pause ended: paused; refused (an error answer) or ejected (it cannot take part: no "
        "connection, or no such route), and then it is never resumed; no_answer (it may have paused: it is resumed); "
        "removed (no longer registered: nothing was asked of it); null until the pause's answers are recorded"
    )
    error: str | None


class WeightUpdateOut(BaseModel):
    id: int
    mode: PauseMode
    phase: Literal["pausing", "paused", "loading", "loaded", "resuming", "done", "rolling_back", "rolled_back"]
    open: bool
    proxy: Literal["wait", "reject"]
    from_version: int
    to_version: int | None
    load_path: str | None
    deadline: datetime
    error: str | None
    created_at: datetime
    finished_at: datetime | None
    backends: list[WeightUpdateBackendOut]


class WeightsOut(BaseModel):
    """The farm's weights: the newest version served, each backend's, and the update in progress."""

    version: int = Field(description="the newest weight version any backend serves")
    backends: dict[str, int] = Field(description="backend id -> the weight version it serves")
    paused: bool = Field(description="new turns are held for a weight update")
    update: WeightUpdateOut | None = Field(description="the open update, else the last one")
