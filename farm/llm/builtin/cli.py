"""``farm llm``: run the built-in CPU backend and build the tiny model. Mounted into the main ``farm`` CLI."""

from __future__ import annotations

from pathlib import Path

import click

from farm.llm.builtin.tiny import DEFAULT_MAX_POSITIONS, DEFAULT_SEED
from farm.llm.families import DEFAULT_CACHE_DIR, FAMILIES

DEFAULT_HOST = "127.0.0.1"
DEFAULT_PORT = 8800
DEFAULT_MODEL_NAME = "farm-tiny"

llm = click.Group("llm", help="LLM backends: the built-in CPU server and the tiny test model.")


@llm.command("serve")
@click.argument("model_dir", type=click.Path(exists=True, file_okay=False, path_type=Path))
@click.option("--host", default=DEFAULT_HOST, show_default=True)
@click.option("--port", default=DEFAULT_PORT, show_default=True, type=int)
@click.option("--model-name", default=DEFAULT_MODEL_NAME, show_default=True, help="name served at /v1/models")
@click.option("--max-batch", default=None, type=int, help="sequences decoded per step (default: the engine's, 16)")
@click.option("--threads", default=1, show_default=True, type=int, help="torch CPU threads (0: torch's choice)")
@click.option(
    "--script",
    "script_path",
    default=None,
    type=click.Path(exists=True, dir_okay=False, path_type=Path),
    help='scripted replies, JSON {"rules": [{"match": REGEX, "turns": [TEXT, ...]}]}; unmatched prompts are sampled',
)
@click.option(
    "--step-time-ms",
    default=0.0,
    show_default=True,
    type=click.FloatRange(0, 10_000),
    help="each decode step lasts at least this long: a bigger model's pace, for benchmarks and tests of "
    "what happens while a turn is decoding",
)
def serve(
    model_dir: Path,
    host: str,
    port: int,
    model_name: str,
    max_batch: int | None,
    threads: int,
    script_path: Path | None,
    step_time_ms: float,
) -> None:
    """Serve MODEL_DIR with vLLM's endpoints (/v1/completions, /inference/v1/generate, /metrics)."""
    import uvicorn

    from farm.errors import ConfigError
    from farm.llm.builtin.script import load_script

    try:
        script = load_script(script_path) if script_path is not None else None
    except ConfigError as exc:
        raise click.BadParameter(str(exc), param_hint="--script") from exc

    from farm.llm.builtin.engine import Engine
    from farm.llm.builtin.server import create_app

    # torch loads only here: mounting this group into `farm` must not import it.
    engine = Engine(
        model_dir=model_dir,
        threads=threads or None,
        min_step_s=step_time_ms / 1000.0,
        **({"max_batch": max_batch} if max_batch else {}),
    )
    app = create_app(model_dir=model_dir, model_name=model_name, engine=engine, script=script)
    uvicorn.run(app, host=host, port=port, log_level="warning")


@llm.command("make-tiny")
@click.argument("out_dir", type=click.Path(file_okay=False, path_type=Path))
@click.option("--seed", default=DEFAULT_SEED, show_default=True, type=int, help="seeds the random weights")
@click.option(
    "--context",
    default=DEFAULT_MAX_POSITIONS,
    show_default=True,
    type=click.IntRange(64, 262_144),
    help="context length in tokens (e.g. 32768 for harnesses with long system prompts)",
)
@click.option(
    "--family",
    type=click.Choice(sorted(FAMILIES)),
    default=None,
    help="a real model family's tokenizer, chat template and architecture (scripts/setup_families.sh first)",
)
@click.option(
    "--families-dir",
    type=click.Path(file_okay=False, path_type=Path),
    envvar="FARM_FAMILIES_DIR",
    default=DEFAULT_CACHE_DIR,
    show_default=True,
    help="where scripts/setup_families.sh put the families' vocabularies and templates",
)
def make_tiny_cmd(out_dir: Path, seed: int, context: int, family: str | None, families_dir: Path) -> None:
    """Write a tiny random model to OUT_DIR: a Llama with a locally trained tokenizer, or with
    --family, the family's own tokenizer, template and architecture."""
    from farm.errors import FamiliesMissing
    from farm.llm.builtin.tiny import make_tiny

    try:
        make_tiny(out_dir, seed=seed, context=context, family=family, families_dir=families_dir)
    except FamiliesMissing as exc:
        raise click.ClickException(str(exc)) from None
    click.echo(str(out_dir))


if __name__ == "__main__":
    llm()
