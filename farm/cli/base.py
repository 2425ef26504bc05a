"""The ``farm`` group and what every command shares: the two consoles, the settings (built here,
once, from the environment, ``FARM_*``, and passed down), the API client, and the exit statuses.

A command's result (a table, a batch id, a path written, ``--json``) goes to stdout, ``out``;
progress and messages go to stderr, ``console``: ``BATCH=$(farm submit --no-wait f.jsonl)`` and
``farm status --once > f`` capture the result alone. Every command exits with one of:

- ``EXIT_OK`` (0): done;
- ``EXIT_FAILED`` (1): the command ran and the farm failed it or could not be reached: an API that
  is down or answered 5xx, a replay that did not reproduce, a farm process that died;
- ``EXIT_REFUSED`` (2): what was asked cannot be done as asked: a usage error (click's own 2), a
  setting or argument that is wrong, something that does not exist, input the farm refused (4xx).
"""

from __future__ import annotations

import json
import sys
from typing import Any

import click
from pydantic import BaseModel, ValidationError
from rich.console import Console

from farm.config import Settings

EXIT_OK, EXIT_FAILED, EXIT_REFUSED = 0, 1, 2

# Piped output (CI logs, `| tee`) gets room for the closing tables instead of rich's 80 columns.
console = Console(stderr=True, width=None if sys.stderr.isatty() else 120)
out = Console(width=None if sys.stdout.isatty() else 120)


def print_json(value: BaseModel | dict[str, Any] | list[Any]) -> None:
    """``value`` as one JSON document on stdout (plain, for ``jq``: no colour, no wrapping)."""
    text = value.model_dump_json() if isinstance(value, BaseModel) else json.dumps(value, default=str)
    click.echo(text)


#: how long a command's calls retry an API that answers "retry" or cannot be reached.
CLI_RETRY_S = 5.0


def load_settings() -> Settings:
    from farm.errors import ConfigError
    from farm.handlers.registry import allow_handler_paths

    try:
        settings = Settings()
    except ValidationError as exc:
        raise ConfigError(settings_problem(exc)) from None
    allow_handler_paths(settings.handler_paths)
    return settings


def api_client(settings: Settings, url: str | None) -> Any:
    from farm.client import FarmClient, RetryPolicy
    from farm.embedded import token_file

    token = settings.api.token.get_secret_value() if settings.api.token else None
    if token is None and token_file(settings).is_file():
        token = token_file(settings).read_text().strip()
    # A person at a terminal: a blip is ridden out, an API that is not up is said within seconds.
    return FarmClient(url or settings.api_url, token=token, retry=RetryPolicy(total_s=CLI_RETRY_S))


def settings_problem(exc: ValidationError) -> str:
    """A settings error as one line naming the environment variable (``FARM_API__PORT``), not
    pydantic's report with its traceback."""
    problems = []
    for error in exc.errors():
        name = "FARM_" + "__".join(str(part).upper() for part in error["loc"])
        given = error.get("input")
        shown = f" (got {given!r})" if isinstance(given, str | int | float) else ""
        problems.append(f"{name}: {error['msg']}{shown}")
    return "setting " + "; ".join(problems)


class _FarmGroup(click.Group):
    """Answers the errors a user causes or meets (the API refused, the API is not up, a setting is
    wrong) with one line and an exit status, never a traceback."""

    def invoke(self, ctx: click.Context) -> Any:
        import httpx

        from farm.errors import ApiError, ConfigError, FarmError, InvalidSpec, NotFound

        try:
            return super().invoke(ctx)
        except ApiError as exc:
            console.print(f"[red]error ({exc.status} {exc.code}):[/] {exc.detail}", highlight=False, soft_wrap=True)
            for problem in exc.errors or []:
                console.print(f"  {problem.get('field')}: {problem.get('detail')}", highlight=False, markup=False)
            ctx.exit(EXIT_REFUSED if exc.status < 500 else EXIT_FAILED)
        except (ConfigError, NotFound, InvalidSpec) as exc:
            console.print(f"[red]error:[/] {exc}", highlight=False, soft_wrap=True)
            ctx.exit(EXIT_REFUSED)
        except FarmError as exc:
            console.print(f"[red]error:[/] {exc}", highlight=False, soft_wrap=True)
            ctx.exit(EXIT_FAILED)
        except httpx.TransportError as exc:
            url = str(exc.request.url.copy_with(path="/", query=None)) if _has_request(exc) else "the API"
            # The client's own message names the URL already (``farm.client.base.naming_url``).
            cause = exc.__cause__ if isinstance(exc.__cause__, httpx.TransportError) else exc
            console.print(
                f"[red]error:[/] cannot reach the farm API at {url} ({cause or type(cause).__name__}); "
                "is it up (`farm up`), and are --url or FARM_API__HOST/FARM_API__PORT right?",
                highlight=False,
                soft_wrap=True,  # one line however narrow the terminal: a script greps it
            )
            ctx.exit(EXIT_FAILED)


def _has_request(exc: Exception) -> bool:
    try:
        return getattr(exc, "request", None) is not None
    except RuntimeError:  # httpx raises when an error was made without a request
        return False


@click.group(cls=_FarmGroup, epilog="Exit status: 0 done; 1 the farm failed or is unreachable; 2 refused as asked.")
@click.version_option(package_name="rollout-farm")
def main() -> None:
    """rollout-farm: run agent rollouts as a service and hand back token-exact trajectories.

    Results go to stdout (--json where a command draws a table), progress and messages to stderr."""
