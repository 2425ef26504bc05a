"""``swe-image``'s config: the instance record and the image, alone so the API validates a
submit without importing the handler (see ``tasks.swe_image.handler``)."""

from __future__ import annotations

from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field, field_validator

from tasks.budget import EpisodeBudget


class SweImageInstance(BaseModel):
    """An instance record; field names are SWE-bench's (``test_cmd`` as in its harness specs)."""

    model_config = ConfigDict(extra="ignore", frozen=True)

    instance_id: str = Field(pattern=r"^[A-Za-z0-9_.-]+$", max_length=200)
    repo: str = Field(max_length=500)
    base_commit: str = Field(pattern=r"^[0-9a-f]{7,64}$")
    problem_statement: str = Field(max_length=200_000)
    test_cmd: str = Field(min_length=1, max_length=10_000, description="bash, run in the repository")
    FAIL_TO_PASS: list[str] = Field(min_length=1)
    PASS_TO_PASS: list[str] = Field(default_factory=list)
    test_patch: str = Field(default="", max_length=10_000_000)


class SweImageConfig(EpisodeBudget):
    """What a trainer submits: the record, the image, and where the repository is in it."""

    model_config = ConfigDict(extra="forbid")

    instance: SweImageInstance
    image: str = Field(max_length=4096, description="the instance's image on the nodes (absolute path)")
    workdir: str = Field(default="/testbed", pattern=r"^/[A-Za-z0-9_./-]*$", max_length=1000)
    max_turns: int = Field(default=30, ge=1, le=500)
    test_timeout_s: float = Field(default=300.0, gt=0, le=7200)

    @field_validator("image")
    @classmethod
    def _absolute(cls, value: str) -> str:
        path = value.split(":", 1)[1] if value.split(":", 1)[0] in ("docker-archive", "oci", "oci-archive") else value
        if not Path(path.removeprefix("dockerfile:")).is_absolute():
            raise ValueError(f"image must be an absolute path on the nodes, got {value!r}")
        return value


config_class = SweImageConfig

__all__ = ["SweImageConfig", "SweImageInstance", "config_class"]
