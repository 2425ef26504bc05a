"""The ``harness`` task's config: which task to run, and which harness runs it.

Found by the naming rule of :mod:`farm.handlers.registry`, so the API validates a submit without
loading agent or sandbox code: the inner task's config is validated by that task type's own
config class, also found by name.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationInfo, field_validator, model_validator

from farm.errors import InvalidSpec
from farm.handlers.base import validate_config
from farm.handlers.registry import get_config_class
from farm.schemas.trials import TrialHistory

#: task types whose grading needs only what the agent left in its sandbox (a harness cannot call
#: the built-in agent's ``submit``).
SUPPORTED_TASKS = ("swe", "harbor")
Preset = Literal["mini-swe-agent", "claude-code", "codex", "command"]


class InnerTask(BaseModel):
    model_config = ConfigDict(extra="forbid")

    type: Literal["swe", "harbor"] = Field(description="the task type whose sandbox and grader are used")
    config: dict[str, Any] = Field(description="that task type's config")

    # On the field, not the model: a 422 then names task.config (the inner field in its message),
    # where a model validator's error names no field at all.
    @field_validator("config")
    @classmethod
    def _valid_for_its_type(cls, value: dict[str, Any], info: ValidationInfo) -> dict[str, Any]:
        task_type = info.data.get("type")
        if task_type is None:  # the type itself was refused; that error says so
            return value
        try:
            validate_config(get_config_class(task_type), value)
        except InvalidSpec as exc:
            raise ValueError(f"the {task_type} task's {exc.message}") from exc
        return value


class HarnessSpec(BaseModel):
    """Which harness runs in the sandbox, and how long it may."""

    model_config = ConfigDict(extra="forbid")

    preset: Preset = "mini-swe-agent"
    #: for ``preset: command``: argv, with ``{instruction}``, ``{openai_base_url}``,
    #: ``{anthropic_base_url}``, ``{api_key}``, ``{model}`` and ``{workdir}`` filled in.
    command: list[str] | None = Field(default=None, min_length=1)
    #: extra environment for the harness (a preset's own variables win).
    env: dict[str, str] = Field(default_factory=dict)
    #: the most model calls (turns) the harness is told it may make.
    max_turns: int = Field(default=30, ge=1, le=1000)
    #: wall-clock limit of the harness process; the task's own limit when unset.
    time_limit_s: float | None = Field(default=None, gt=0, le=24 * 3600)
    #: the trial's history policy (docs/proxy.md#history-exact-or-template). Unset: the batch's
    #: ``history`` (itself ``exact`` unless the batch says otherwise); set, it wins over the batch's.
    history: TrialHistory | None = None

    @model_validator(mode="after")
    def _command_for_command(self) -> HarnessSpec:
        if (self.preset == "command") != (self.command is not None):
            raise ValueError("command is given exactly when preset is 'command'")
        return self


class HarnessConfig(BaseModel):
    model_config = ConfigDict(extra="forbid")

    task: InnerTask
    harness: HarnessSpec = Field(default_factory=HarnessSpec)


config_class = HarnessConfig

__all__ = ["SUPPORTED_TASKS", "HarnessConfig", "HarnessSpec", "InnerTask", "config_class"]
