"""The tools of an episode in a sandbox, and how they are described to the model."""

from __future__ import annotations

import copy
from collections.abc import Mapping, Sequence
from typing import Any

from farm.agent.loop import SUBMIT_SPEC
from farm.agent.turns import CALL_SHAPES, SUBMIT
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


class ToolSpecs(list[dict[str, Any]]):
    """An episode's tool specs as its handler's ``messages`` gets them, with how the model will see
    them: ``described_by_template`` when the chat template writes the tools into the prompt itself
    (with its own instructions for calling them, as the real families' templates do), and the
    format the model writes calls in (``call_format``, vLLM's parser name)."""

    def __init__(
        self,
        specs: Sequence[Mapping[str, Any]] = (),
        *,
        described_by_template: bool = False,
        call_format: str = "hermes",
    ) -> None:
        super().__init__(dict(spec) for spec in specs)
        self.described_by_template = described_by_template
        self.call_format = call_format


def system_prompt(intro: str, specs: Sequence[Mapping[str, Any]]) -> str:
    """``intro``, then the call format and every tool's description; only ``intro`` and when to
    submit where the chat template describes the tools itself (``ToolSpecs``)."""
    if isinstance(specs, ToolSpecs) and specs.described_by_template:
        return f"{intro}\n\nWhen you are done, call {SUBMIT}."
    call_format = specs.call_format if isinstance(specs, ToolSpecs) else "hermes"
    if call_format == "hermes":
        how = (
            "To use a tool, write a block like this (one JSON object per block; "
            "several blocks per turn are run in order):\n"
            '<tool_call>{"name": "bash", "arguments": {"command": "ls"}}</tool_call>\n'
        )
    else:
        shape = CALL_SHAPES.get(call_format, call_format)
        how = f"To use a tool, write a call like this (several calls per turn are run in order):\n{shape}\n"
    return (
        f"{intro}\n\n{how}"
        f"Each call is answered with its output. When you are done, call {SUBMIT}.\n\n"
        f"# Tools\n\n{describe_specs(specs)}"
    )
