"""The handler interface: one method per stage, plain data in and out.

A handler never opens database sessions, reads settings or calls Celery: the pipeline
hands it what it needs through ``StageContext`` (sandboxes, LLM sessions and tools are
added there as resources), and stores what it returns. Each method may be a plain
function or a coroutine function; the pipeline runs coroutines to completion.
"""

from __future__ import annotations

import json
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any, ClassVar, Generic, TypeAlias, TypeVar

from pydantic import BaseModel, ValidationError

from farm.constants import Stage
from farm.errors import InvalidSpec
from farm.schemas import EvalResult, RunResult, SamplingParams, TrajectoryData

ConfigT = TypeVar("ConfigT", bound=BaseModel)
Maybe = TypeVar("Maybe")
#: a handler method's return: the value, or a coroutine producing it.
MaybeAwaitable: TypeAlias = Maybe | Awaitable[Maybe]


@dataclass(frozen=True)
class StageContext:
    """What one stage of one job may use."""

    job_id: int
    batch_id: int
    stage: Stage
    attempt: int
    node: str
    sampling: SamplingParams
    seed: int | None
    #: time.monotonic() after which the stage must give up (agent_timeout for RUN).
    deadline: float
    #: true once the job's batch was cancelled: agent loops check it every turn.
    is_cancelled: Callable[[], bool] = lambda: False
    resources: dict[str, Any] = field(default_factory=dict)

    def remaining_s(self) -> float:
        return self.deadline - time.monotonic()


def validate_config(config_class: type[ConfigT], config: dict[str, Any]) -> ConfigT:
    """Validate a task config, raising InvalidSpec that names the first bad field."""
    try:
        # As JSON, strictly: a config arrives as JSON, where `false` is no integer and `1` no boolean.
        return config_class.model_validate_json(json.dumps(config), strict=True)
    except ValidationError as exc:
        first = exc.errors()[0]
        where = ".".join(str(part) for part in first["loc"]) or "(config)"
        raise InvalidSpec(f"config.{where}: {first['msg']}", field=f"config.{where}") from exc


class TaskHandler(Generic[ConfigT]):
    """Base class of every handler. Subclasses set ``config_class`` and implement the stages.

    ``init`` returns the state RUN needs (JSON-serialisable); ``run`` returns the episode;
    ``evaluate`` scores it. ``teardown`` is always called once the job leaves its node
    (after EVAL, on failure, on cancel); it is a no-op here.
    """

    config_class: ClassVar[type[BaseModel]]

    def validate(self, config: dict[str, Any]) -> ConfigT:
        return validate_config(self.config_class, config)  # type: ignore[return-value]

    def init(self, config: ConfigT, ctx: StageContext) -> MaybeAwaitable[dict[str, Any]]:
        return {}

    def run(self, config: ConfigT, state: dict[str, Any], ctx: StageContext) -> MaybeAwaitable[RunResult]:
        raise NotImplementedError(f"{type(self).__name__} has no RUN stage")

    def evaluate(
        self, config: ConfigT, state: dict[str, Any], trajectory: TrajectoryData, ctx: StageContext
    ) -> MaybeAwaitable[EvalResult]:
        raise NotImplementedError(f"{type(self).__name__} has no EVAL stage")

    def teardown(self, config: ConfigT, state: dict[str, Any], ctx: StageContext) -> MaybeAwaitable[None]:
        return None
