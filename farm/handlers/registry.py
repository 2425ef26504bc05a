"""Handlers by name: the ``farm.handlers`` entry-point group, or a ``module:Class`` path."""

from __future__ import annotations

import importlib
import re
from functools import cache
from importlib.metadata import entry_points
from typing import Any

from farm.errors import ConfigError, HandlerNotFound
from farm.handlers.base import TaskHandler

ENTRY_POINT_GROUP = "farm.handlers"
#: ``package.module:Class``, ASCII identifiers only: anything else is no handler path.
TARGET_PATTERN = r"^[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*:[A-Za-z_][A-Za-z0-9_]*$"
_TARGET = re.compile(TARGET_PATTERN)


@cache
def known_handlers() -> dict[str, str]:
    """Task type -> dotted target, from installed packages' entry points."""
    return {ep.name: ep.value for ep in entry_points(group=ENTRY_POINT_GROUP)}


def _load(target: str) -> type[TaskHandler[Any]]:
    module_name, _, attr = target.partition(":")
    try:
        obj = getattr(importlib.import_module(module_name), attr)
    except Exception as exc:  # any error at import time: the module itself is broken
        raise ConfigError(f"handler {target!r} cannot be imported: {exc}") from exc
    if not (isinstance(obj, type) and issubclass(obj, TaskHandler)):
        raise ConfigError(f"handler {target!r} is not a TaskHandler subclass")
    return obj


@cache
def get_handler(name: str) -> TaskHandler[Any]:
    """The handler for a task type: an entry-point name, or ``package.module:Class``.

    Raises:
        HandlerNotFound: no such task type; the message lists the known ones.
        ConfigError: the target exists but cannot be imported or is not a handler.
    """
    target = known_handlers().get(name)
    if target is None:
        if not _TARGET.match(name):
            known = ", ".join(sorted(known_handlers())) or "(none installed)"
            raise HandlerNotFound(f"unknown task type {name!r}; known types: {known}")
        target = name
    return _load(target)()
