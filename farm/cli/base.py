"""The ``farm`` group and what every command shares: the console, the settings (built here, once,
from the environment, ``FARM_*``, and passed down) and the API client."""

from __future__ import annotations

import sys
from typing import Any

import click
from rich.console import Console

from farm.config import Settings

# Piped output (CI logs, `| tee`) gets room for the closing tables instead of rich's 80 columns.
console = Console(stderr=True, width=None if sys.stderr.isatty() else 120)


#: how long a command's calls retry an API that answers "retry" or cannot be reached.
CLI_RETRY_S = 5.0


def load_settings() -> Settings:
    from farm.handlers.registry import allow_handler_paths

    settings = Settings()
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


class _FarmGroup(click.Group):
    """Answers the errors a user causes or meets (the API refused, the API is not up) with one
    line and an exit status, never a traceback."""

    def invoke(self, ctx: click.Context) -> Any:
        import httpx

        from farm.errors import ApiError, ConfigError

        try:
            return super().invoke(ctx)
        except ApiError as exc:
            console.print(f"[red]error ({exc.status} {exc.code}):[/] {exc.detail}", highlight=False)
            ctx.exit(2)
        except ConfigError as exc:
            console.print(f"[red]error:[/] {exc}", highlight=False)
            ctx.exit(1)
        except httpx.TransportError as exc:
            url = str(exc.request.url.copy_with(path="/", query=None)) if _has_request(exc) else "the API"
            console.print(
                f"[red]error:[/] cannot reach the farm API at {url} ({exc or type(exc).__name__}); "
                "is it up (`farm up`), and are --url or FARM_API__HOST/FARM_API__PORT right?",
                highlight=False,
            )
            ctx.exit(1)


def _has_request(exc: Exception) -> bool:
    try:
        return getattr(exc, "request", None) is not None
    except RuntimeError:  # httpx raises when an error was made without a request
        return False


@click.group(cls=_FarmGroup)
@click.version_option(package_name="rollout-farm")
def main() -> None:
    """rollout-farm: run agent rollouts as a service and hand back token-exact trajectories."""
