"""The tools of an episode in a sandbox, and how they are described to the model."""

from __future__ import annotations

import copy
from collections.abc import Mapping, Sequence
from typing import Any

from farm.agent.loop import SUBMIT_SPEC
from farm.tools.base import ToolResult
from farm.tools.client import ToolClient
from farm.tools.schema import TOOL_SPECS, describe_specs

#: tools whose calls take a ``timeout_s`` the loop clamps to the episode's time left.
_TIMED = frozenset({"bash", "ipython"})


class SandboxToolbox:
    """``names`` from :data:`farm.tools.schema.TOOL_SPECS`, plus ``submit`` (handled by the loop)."""

    def __init__(self, client: ToolClient, names: Sequence[str], *, default_timeout_s: float | None = None) -> None:
        unknown = [n for n in names if n not in TOOL_SPECS]
        if unknown:
            raise KeyError(f"unknown tools {unknown}; known: {sorted(TOOL_SPECS)}")
        self.client = client
        self.names = list(names)
        self.default_timeout_s = default_timeout_s
        self._specs = [copy.deepcopy(TOOL_SPECS[n]) for n in self.names] + [copy.deepcopy(SUBMIT_SPEC)]

    @property
    def specs(self) -> Sequence[Mapping[str, Any]]:
        return self._specs

    def call(self, name: str, arguments: dict[str, Any], *, timeout_s: float | None) -> ToolResult:
        args = dict(arguments)
        if name in _TIMED:
            asked = args.get("timeout_s")
            limits = [t for t in (asked, self.default_timeout_s, timeout_s) if isinstance(t, int | float) and t > 0]
            args["timeout_s"] = min(limits) if limits else None
        return self.client.call(name, args)


def system_prompt(intro: str, specs: Sequence[Mapping[str, Any]]) -> str:
    """``intro``, then the call format and every tool's description."""
    return (
        f"{intro}\n\n"
        "To use a tool, write a block like this (one JSON object per block; "
        "several blocks per turn are run in order):\n"
        '<tool_call>{"name": "bash", "arguments": {"command": "ls"}}</tool_call>\n'
        "Each call is answered with its output. When you are done, call submit.\n\n"
        f"# Tools\n\n{describe_specs(specs)}"
    )
