"""Tool descriptions, written once, in the OpenAI function-calling shape.

The agent loop puts :func:`tool_specs` into the prompt (or the ``tools`` field of a chat
request) and sends the model's calls to :meth:`farm.tools.client.ToolClient.call`.
"""

from __future__ import annotations

import copy
from collections.abc import Mapping, Sequence
from typing import Any

_TIMEOUT = {"type": "number", "description": "seconds before the call is interrupted (optional)"}

TOOL_SPECS: dict[str, dict[str, Any]] = {
    "bash": {
        "name": "bash",
        "description": (
            "Run a command in a persistent bash shell. The working directory, environment variables and "
            "shell functions persist between calls. Output (stdout and stderr) is cut in the middle when long. "
            "A command that runs past its timeout is interrupted with Ctrl-C; the shell stays usable. "
            "Do not start interactive programs; run servers in the background with '&'."
        ),
        "parameters": {
            "type": "object",
            "properties": {
                "command": {"type": "string", "description": "the bash command to run"},
                "timeout_s": _TIMEOUT,
            },
            "required": ["command"],
        },
    },
    "ipython": {
        "name": "ipython",
        "description": (
            "Execute Python code in a persistent IPython kernel; variables and imports persist between calls. "
            "Returns printed output, the value of the last expression, or the traceback of an error."
        ),
        "parameters": {
            "type": "object",
            "properties": {"code": {"type": "string", "description": "Python code to execute"}, "timeout_s": _TIMEOUT},
            "required": ["code"],
        },
    },
    "editor": {
        "name": "editor",
        "description": (
            "View and edit files. Commands: 'view' shows a file with line numbers (optionally a view_range) "
            "or lists a directory; 'create' writes file_text to a new or existing file; 'str_replace' replaces "
            "old_str, which must occur exactly once, with new_str; 'insert' puts new_str after line insert_line "
            "(0 for the top); 'undo_edit' reverts the last edit of the file. Relative paths are in the workspace."
        ),
        "parameters": {
            "type": "object",
            "properties": {
                "command": {"type": "string", "enum": ["view", "create", "str_replace", "insert", "undo_edit"]},
                "path": {"type": "string", "description": "file or directory path"},
                "file_text": {"type": "string", "description": "content for 'create'"},
                "old_str": {"type": "string", "description": "exact text to replace, unique in the file"},
                "new_str": {"type": "string", "description": "replacement ('str_replace') or text to insert"},
                "insert_line": {"type": "integer", "description": "line after which to insert ('insert')"},
                "view_range": {
                    "type": "array",
                    "items": {"type": "integer"},
                    "description": "[start, end] 1-based lines for 'view'; end -1 means the last line",
                },
            },
            "required": ["command", "path"],
        },
    },
}


def tool_specs(names: list[str] | None = None) -> list[dict[str, Any]]:
    """Specs as ``[{"type": "function", "function": {...}}]``; all tools when ``names`` is None.

    Raises:
        KeyError: a name is not a known tool.
    """
    chosen = list(TOOL_SPECS) if names is None else names
    return [{"type": "function", "function": copy.deepcopy(TOOL_SPECS[name])} for name in chosen]


def describe_specs(specs: Sequence[Mapping[str, Any]]) -> str:
    """Function specs (``{"name", "description", "parameters"}``) as plain text for a system prompt."""
    blocks = []
    for spec in specs:
        params = spec.get("parameters") or {}
        required = set(params.get("required") or [])
        properties: Mapping[str, Any] = params.get("properties") or {}
        lines = [f"## {spec['name']}", str(spec.get("description", ""))]
        if properties:
            lines.append("Arguments (JSON object):")
        for pname, pspec in properties.items():
            kind = str(pspec.get("type", "any"))
            if "enum" in pspec:
                kind += " one of " + ", ".join(map(str, pspec["enum"]))
            desc = pspec.get("description", "")
            need = "required" if pname in required else "optional"
            lines.append(f"- {pname} ({kind}, {need}){': ' + desc if desc else ''}")
        blocks.append("\n".join(lines))
    return "\n\n".join(blocks)


def tools_prompt(names: list[str] | None = None) -> str:
    """The same specs as plain text, for models prompted without a ``tools`` field.

    Raises:
        KeyError: a name is not a known tool.
    """
    return describe_specs([spec["function"] for spec in tool_specs(names)])
