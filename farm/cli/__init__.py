"""``farm``: the one command-line entry point (``farm.cli:main``).

``base`` holds the group and what every command shares (console, settings, API client); the
commands sit by what they do: ``serve`` runs farm processes, ``batch`` talks to a running farm's
API, ``rerun`` runs a finished job's parts again here. ``process`` binds the proxy's sockets and
starts its processes; ``memory`` tunes the API process's allocator.
"""

from __future__ import annotations

# Imported for their commands, which register on ``main``.
from farm.cli import batch, rerun, serve  # noqa: F401
from farm.cli.base import main

__all__ = ["main"]


def _mount_optional_groups() -> None:
    try:
        from farm.llm.builtin.cli import llm
    except ImportError:
        return
    main.add_command(llm)


_mount_optional_groups()
