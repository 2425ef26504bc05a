"""Handlers by name: the ``farm.handlers`` entry-point group, and the ``module:Class`` paths the
operator allows (the ``handler_paths`` setting, applied by each process's entry point with
``allow_handler_paths``). A task type is a request's string: one that is neither is refused
without importing anything, so no request can make the farm import a module it names.

A handler's config class can be had without importing the handler (the API validates submits
with it, and must not load sandboxes or the agent loop): for a handler at ``pkg.handler:Class``,
the light module ``pkg.config`` names it as its module-level ``config_class``. A handler
without such a module is imported for its ``config_class`` instead.
"""

from __future__ import annotations

import importlib
import importlib.util
import inspect
import re
from collections.abc import Iterable
from functools import cache
from importlib.metadata import entry_points
from typing import Any

from pydantic import BaseModel

from farm.errors import ConfigError, HandlerNotFound
from farm.handlers.base import STAGE_METHODS, TaskHandler

ENTRY_POINT_GROUP = "farm.handlers"
#: ``package.module:Class``, ASCII identifiers only: anything else is no handler path.
TARGET_PATTERN = r"^[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*:[A-Za-z_][A-Za-z0-9_]*$"
_TARGET = re.compile(TARGET_PATTERN)
#: the handler module's name, and its sibling's that holds the config class alone.
HANDLER_MODULE = "handler"
CONFIG_MODULE = "config"


#: the ``module:Class`` paths that are task types besides the entry points (``allow_handler_paths``).
_allowed_paths: frozenset[str] = frozenset()


def allow_handler_paths(paths: Iterable[str]) -> None:
    """Make these ``package.module:Class`` paths task types too (each its own name), in place of
    any allowed before: the operator's ``handler_paths`` setting, for a handler no package
    registers (tests, a handler under development).

    Raises:
        ConfigError: a path is no ``package.module:Class``.
    """
    global _allowed_paths
    paths = frozenset(paths)
    bad = sorted(path for path in paths if not _TARGET.match(path))
    if bad:
        raise ConfigError(f"handler_paths: {', '.join(map(repr, bad))} are not package.module:Class paths")
    if paths != _allowed_paths:
        _allowed_paths = paths
        for cached in (known_handlers, get_handler, get_config_class):
            cached.cache_clear()


@cache
def known_handlers() -> dict[str, str]:
    """Task type -> dotted target: installed packages' entry points and the allowed paths."""
    return {path: path for path in _allowed_paths} | {ep.name: ep.value for ep in entry_points(group=ENTRY_POINT_GROUP)}


def _target(name: str) -> str:
    target = known_handlers().get(name)
    if target is None:
        known = ", ".join(sorted(known_handlers())) or "(none installed)"
        raise HandlerNotFound(f"unknown task type {name!r}; known types: {known}")
    return target


def _import(module_name: str, attr: str, what: str) -> Any:
    try:
        return getattr(importlib.import_module(module_name), attr)
    except Exception as exc:  # any error at import time: the module itself is broken
        raise ConfigError(f"{what} {f'{module_name}:{attr}'!r} cannot be imported: {exc}") from exc


def _load(target: str) -> type[TaskHandler[Any]]:
    module_name, _, attr = target.partition(":")
    obj = _import(module_name, attr, "handler")
    if not (isinstance(obj, type) and issubclass(obj, TaskHandler)):
        raise ConfigError(f"handler {target!r} is not a TaskHandler subclass")
    sync = [name for name in STAGE_METHODS if not inspect.iscoroutinefunction(getattr(obj, name))]
    if sync:
        raise ConfigError(f"handler {target!r}: stage methods must be `async def`: {', '.join(sync)} are not")
    return obj


def _config_module(target: str) -> str | None:
    """``pkg.config`` for a handler at ``pkg.handler:Class``, if that module exists."""
    package, _, leaf = target.partition(":")[0].rpartition(".")
    if leaf != HANDLER_MODULE or not package:
        return None
    name = f"{package}.{CONFIG_MODULE}"
    try:
        found = importlib.util.find_spec(name)
    except Exception:  # the package itself cannot be imported: importing the handler says why
        return None
    return name if found is not None else None


def _light_config(target: str) -> type[BaseModel] | None:
    module_name = _config_module(target)
    if module_name is None:
        return None
    obj = _import(module_name, "config_class", "config")
    if not (isinstance(obj, type) and issubclass(obj, BaseModel)):
        raise ConfigError(f"{module_name}.config_class is not a pydantic model")
    return obj


@cache
def get_handler(name: str) -> TaskHandler[Any]:
    """The handler for a task type: an entry-point name, or an allowed ``package.module:Class``.

    Raises:
        HandlerNotFound: no such task type; the message lists the known ones.
        ConfigError: the target exists but cannot be imported, is not a handler, has a stage
            method that is not async, or its light config module names another config class.
    """
    target = _target(name)
    handler = _load(target)
    light = _light_config(target)
    if light is not None and light is not handler.config_class:
        raise ConfigError(f"handler {target!r}: {_config_module(target)}.config_class is not its config_class")
    return handler()


@cache
def get_config_class(name: str) -> type[BaseModel]:
    """The config class of a task type, from its light config module where it has one.

    Raises:
        HandlerNotFound: no such task type; the message lists the known ones.
        ConfigError: its config module (or, without one, its handler) cannot be imported.
    """
    target = _target(name)
    light = _light_config(target)
    return light if light is not None else get_handler(name).config_class
