"""The Harbor task spec (``HarborConfig``) and the shipped example tasks."""

from __future__ import annotations

import random
from pathlib import Path
from typing import Any

from pydantic import ConfigDict, Field, field_validator, model_validator

from farm.errors import InvalidSpec
from tasks.budget import EpisodeBudget
from tasks.harbor.task import HarborTask, load_task

EXAMPLES_DIR = Path(__file__).parent / "examples"


class HarborConfig(EpisodeBudget):
    """What a trainer submits: a shipped ``example`` by name, or the ``path`` of a task directory.

    A ``path`` must be readable where the spec is validated (the API) and where the job runs
    (the workers): use a shared filesystem, as Harbor datasets on a cluster usually are.
    """

    model_config = ConfigDict(extra="forbid")

    example: str | None = Field(default=None, max_length=200, description="name of a shipped example task")
    path: str | None = Field(default=None, max_length=4096, description="absolute path of a Harbor task directory")
    max_turns: int = Field(default=30, ge=1, le=500)
    setup: str | None = Field(
        default=None,
        max_length=100_000,
        description=(
            "bash run once in /app after environment/workdir is copied, before any agent starts (what the "
            "Dockerfile's RUN steps would do); prepared once per node and copied for every sample"
        ),
    )
    setup_timeout_s: float = Field(default=600.0, gt=0, le=7200, description="wall-clock limit of the setup")
    image: str | None = Field(
        default=None,
        max_length=4096,
        description=(
            "run the task in its container image, as Harbor does: 'build' builds environment/Dockerfile on each "
            "node (needs Docker there), or the path of the built image on the nodes (a docker-save archive, an "
            "OCI layout or archive); tests/ then goes to /tests and the reward to /logs/verifier. Unset: the "
            "host's tools, with /app seeded from environment/workdir"
        ),
    )

    # Field validators, so a 422 names example or path (a model validator's error has no field).
    @field_validator("example")
    @classmethod
    def _shipped(cls, value: str | None) -> str | None:
        if value is not None and value not in list_examples():
            raise ValueError(
                f"unknown example {value!r}; shipped (GET /v1/tasks?type=harbor): {', '.join(list_examples())}"
            )
        return value

    @field_validator("path")
    @classmethod
    def _task_dir(cls, value: str | None) -> str | None:
        if value is None:
            return value
        if not Path(value).is_absolute():
            raise ValueError(f"path must be absolute, got {value!r}")
        try:
            load_task(Path(value))
        except InvalidSpec as exc:
            raise ValueError(exc.message) from exc
        return value

    @field_validator("image")
    @classmethod
    def _image(cls, value: str | None) -> str | None:
        if value is not None and value != "build" and not Path(value).is_absolute():
            raise ValueError(f"image must be 'build' or an absolute path, got {value!r}")
        return value

    @model_validator(mode="after")
    def _one_source(self) -> HarborConfig:
        if (self.example is None) == (self.path is None):
            raise ValueError("give exactly one of example or path")
        if self.image == "build" and self.resolve().dockerfile is None:
            raise ValueError("image 'build' needs the task's environment/Dockerfile, and this task has none")
        return self

    def image_ref(self) -> str | None:
        """``SandboxSpec.image`` for this task, or None (the host's tools)."""
        if self.image == "build":
            return f"dockerfile:{self.resolve().environment_dir}"
        return self.image

    def resolve(self) -> HarborTask:
        return load_task(EXAMPLES_DIR / self.example if self.example is not None else Path(str(self.path)))


def list_examples() -> list[str]:
    return sorted(d.name for d in EXAMPLES_DIR.iterdir() if (d / "task.toml").is_file())


def sample_configs(n: int, *, seed: int = 0) -> list[dict[str, str]]:
    """``n`` task configs (``{"example": ...}``), drawn with replacement: only a few examples ship."""
    rng = random.Random(seed)
    return [{"example": rng.choice(list_examples())} for _ in range(n)]


def shipped() -> list[dict[str, Any]]:
    """The shipped example tasks as the API's task list serves them (``GET /v1/tasks``)."""
    return [{"id": name, "config": {"example": name}, "about": "harbor example"} for name in list_examples()]
