"""The task families and handlers a farm has installed."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel


class ShippedTask(BaseModel):
    """One task a task family ships: submit ``{"type": <family>, "config": config}``."""

    id: str
    config: dict[str, Any]
    about: str | None = None


class TaskSet(BaseModel):
    """The tasks one installed task family ships with it."""

    type: str
    tasks: list[ShippedTask]


class HandlerInfo(BaseModel):
    name: str
    target: str
    config_schema: dict[str, Any] | None
