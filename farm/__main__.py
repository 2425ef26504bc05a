"""``python -m farm`` and the ``farm`` console script: run the ``farm`` CLI.

Nothing but the standard library is imported before the check: the base install (the trainer's
client) has no click or rich, and its ``farm`` says which extra to install instead of a traceback.
"""

from __future__ import annotations

import sys

#: what the command line needs beyond the base install, and the extra that brings it.
CLI_EXTRA = "server"


def main() -> None:
    try:
        import click  # noqa: F401
        import pydantic_settings  # noqa: F401
        import rich  # noqa: F401
    except ModuleNotFoundError as exc:
        sys.stderr.write(
            f"farm: the command line needs the {CLI_EXTRA!r} extra ({exc.name} is not installed); "
            f"install it with: pip install 'rollout-farm[{CLI_EXTRA}]'\n"
            "(the base install is the trainer's client alone: `from farm.client import FarmClient`)\n"
        )
        sys.exit(2)
    from farm.cli import main as cli

    cli()


if __name__ == "__main__":
    main()
