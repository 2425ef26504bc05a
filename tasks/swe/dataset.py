"""Repository bug-fix instances in SWE-bench field names, the task spec, and listing/sampling.

Each instance is a directory ``instances/<instance_id>/`` with ``instance.json`` (the metadata)
and ``repo/`` (the pre-fix files the agent sees, visible tests included). ``test_patch`` adds
the hidden tests at evaluation, ``patch`` is the reference fix. ``base_commit`` is what
``materialise`` produces from ``repo/``; it is stored so a drift in the files is detected.
"""

from __future__ import annotations

import json
import random
from functools import cache
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, field_validator

from tasks.budget import EpisodeBudget

INSTANCES_DIR = Path(__file__).parent / "instances"


class SweInstance(BaseModel):
    """One task instance; field names are SWE-bench's."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    instance_id: str = Field(pattern=r"^[A-Za-z0-9_.-]+$")
    repo: str
    problem_statement: str
    base_commit: str | None = None
    patch: str = Field(default="", description="the reference fix (gold patch)")
    test_patch: str = Field(default="", description="adds the hidden tests, applied at evaluation only")
    FAIL_TO_PASS: list[str] = Field(min_length=1)
    PASS_TO_PASS: list[str] = Field(default_factory=list)
    version: str = "0.1"

    @field_validator("FAIL_TO_PASS", "PASS_TO_PASS")
    @classmethod
    def _node_ids(cls, value: list[str]) -> list[str]:
        bad = [v for v in value if "::" not in v or v.startswith(("-", "/"))]
        if bad:
            raise ValueError(f"not pytest node ids (path.py::test): {bad}")
        return value

    def instruction(self) -> str:
        """The text shown to the agent, which works in a checkout of the pre-fix files."""
        return (
            f"You are working in a checkout of {self.repo}. Resolve this issue by editing the source code; "
            f"the hidden tests will be run after you finish.\n\n<issue>\n{self.problem_statement.strip()}\n</issue>"
        )

    @property
    def repo_dir(self) -> Path:
        """The shipped pre-fix files (only for shipped instances)."""
        return INSTANCES_DIR / self.instance_id / "repo"


class SweConfig(EpisodeBudget):
    """What a trainer submits: a shipped instance by id."""

    model_config = ConfigDict(extra="forbid")

    instance_id: str = Field(max_length=200)
    max_turns: int = Field(default=30, ge=1, le=500)
    test_timeout_s: float = Field(default=120.0, gt=0, le=3600, description="wall-clock limit of the test run")
    setup: str | None = Field(
        default=None,
        max_length=100_000,
        description=(
            "bash run once in /workspace after the base commit, before any agent starts (install dependencies, "
            "build); prepared once per node and copied for every sample; what it makes is not part of the "
            "agent's diff, and the tests run on a copy of it"
        ),
    )
    setup_timeout_s: float = Field(default=600.0, gt=0, le=7200, description="wall-clock limit of the setup")

    @field_validator("instance_id")
    @classmethod
    def _known(cls, value: str) -> str:
        if value not in instances_by_id():
            known = ", ".join(sorted(instances_by_id()))
            raise ValueError(f"unknown instance_id {value!r}; shipped instances (GET /v1/tasks?type=swe): {known}")
        return value

    def resolve(self) -> SweInstance:
        return instances_by_id()[self.instance_id]


@cache
def instances_by_id() -> dict[str, SweInstance]:
    found = {}
    for meta in sorted(INSTANCES_DIR.glob("*/instance.json")):
        instance = SweInstance.model_validate(json.loads(meta.read_text(encoding="utf-8")))
        found[instance.instance_id] = instance
    return found


def list_instances() -> list[SweInstance]:
    return list(instances_by_id().values())


def sample_configs(n: int, *, seed: int = 0) -> list[dict[str, str]]:
    """``n`` task configs (``{"instance_id": ...}``) drawn without replacement, reproducibly."""
    pool = list_instances()
    return [{"instance_id": i.instance_id} for i in random.Random(seed).sample(pool, min(n, len(pool)))]


def shipped() -> list[dict[str, Any]]:
    """The shipped instances as the API's task list serves them (``GET /v1/tasks``)."""
    return [{"id": i.instance_id, "config": {"instance_id": i.instance_id}, "about": i.repo} for i in list_instances()]
