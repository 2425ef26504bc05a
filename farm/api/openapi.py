"""The OpenAPI spec, completed with what only the running service knows.

FastAPI describes a task as ``{type: str, config: object}``; the service accepts far less: a
``type`` that names an installed handler (or a ``package.module:Class`` path the operator allows,
``handler_paths``) and the ``config``
that handler's ``config_class`` validates (read from its light config module where it has one,
see ``farm.handlers.registry``, so the API imports no agent or sandbox code). ``task_spec_schema``
puts exactly that in the spec, one branch per installed handler with its config's JSON schema,
the installed group filters, and the batch size limit this process enforces. What JSON Schema
cannot say (a shipped problem id, one field or another) stays a 422 naming the field.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any

from fastapi import FastAPI

from farm.config import Settings
from farm.dynamic.filters import known_filters
from farm.handlers.registry import get_config_class, known_handlers

REF_PREFIX = "#/components/schemas/"


def _handler_branch(name: str, components: dict[str, Any], name_schema: Any) -> dict[str, Any]:
    """The TaskSpec branch of one handler; its config's sub-schemas go to the components, prefixed."""
    # A component's name holds letters, digits, '.', '-' and '_' only (an allowed path has a ':').
    prefix = re.sub(r"[^A-Za-z0-9._-]", "_", f"{name[:1].upper()}{name[1:]}Task")
    config = get_config_class(name).model_json_schema(ref_template=f"{REF_PREFIX}{prefix}{{model}}")
    for def_name, definition in config.pop("$defs", {}).items():
        components[f"{prefix}{def_name}"] = definition
    return {
        "type": "object",
        "title": f"{prefix}Spec",
        "additionalProperties": False,
        "properties": {"type": {"const": name}, "config": config, "name": name_schema},
        # A config with required fields cannot be left out (its default is {}).
        "required": ["type", "config"] if config.get("required") else ["type"],
    }


def task_spec_schema(spec: dict[str, Any], settings: Settings) -> None:
    """Rewrite ``TaskSpec`` and ``BatchCreate.tasks`` in ``spec`` (in place), as described above."""
    components = spec["components"]["schemas"]
    task = components["TaskSpec"]
    name_schema = task["properties"]["name"]
    # Only these types: no other is ever imported for a request (farm.handlers.registry).
    branches = [_handler_branch(name, components, name_schema) for name in sorted(known_handlers())]
    components["TaskSpec"] = {"title": "TaskSpec", "description": task.get("description", ""), "oneOf": branches}
    # A filter is one of those installed, as a task type is (the pattern alone allowed any name).
    components["DynamicSampling"]["properties"]["filter"]["enum"] = known_filters()
    components["BatchCreate"]["properties"]["tasks"]["maxItems"] = settings.api.max_tasks_per_batch
    components["BatchCreate"]["properties"]["group_size"]["description"] = (
        f"jobs per task; without `dynamic`, tasks x group_size is at most {settings.api.max_jobs_per_batch}"
    )


#: what every operation may answer when the HTTP server cannot parse the request.
MALFORMED_HTTP: dict[str, Any] = {
    "description": "Malformed HTTP (a request line or header the server cannot parse): the HTTP server's "
    "plain-text answer, given before the API sees the request",
    "content": {"text/plain": {"schema": {"type": "string"}}},
}


def install_openapi(app: FastAPI, settings: Settings) -> None:
    """Serve the completed spec at ``/openapi.json`` (built once, on first request)."""
    base: Callable[[], dict[str, Any]] = app.openapi

    def openapi() -> dict[str, Any]:
        if app.openapi_schema is None:
            spec = base()
            task_spec_schema(spec, settings)
            # FastAPI lists every model a field's type names, even the branches it leaves out of
            # the schema: RawArray exists only client side (see TrajectoryOut), nothing refers to it.
            spec["components"]["schemas"].pop("RawArray", None)
            # The HTTP server answers a request it cannot parse (a byte that is not ASCII in the
            # request line, a line past its size limit) itself, in plain text, before any route.
            for operations in spec["paths"].values():
                for operation in operations.values():
                    operation["responses"].setdefault("400", MALFORMED_HTTP)
            app.openapi_schema = spec
        return app.openapi_schema

    app.openapi = openapi  # type: ignore[method-assign]
