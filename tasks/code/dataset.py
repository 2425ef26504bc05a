"""The code task spec (``CodeConfig``) and the shipped "write a Python function" problems."""

from __future__ import annotations

import json
import random
from functools import cache
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from tasks.budget import EpisodeBudget

DATA_PATH = Path(__file__).parent / "data" / "problems.jsonl"


class CodeProblem(BaseModel):
    """One problem: what to write, and hidden tests (Python snippets that raise on failure)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    id: str
    entry_point: str = Field(pattern=r"^[A-Za-z_][A-Za-z0-9_]*$")
    signature: str
    prompt: str
    tests: list[str] = Field(min_length=1)
    reference_solution: str | None = None

    def instruction(self) -> str:
        """The text shown to the model."""
        head = f"Write a Python function `{self.signature}`."
        return f"{head}\n\n{self.prompt}\n\nAnswer with the code in a ```python block."


class CodeConfig(EpisodeBudget):
    """What a trainer submits: a shipped ``problem_id``, or an inline problem with its tests."""

    model_config = ConfigDict(extra="forbid")

    problem_id: str | None = Field(default=None, max_length=200)
    problem: CodeProblem | None = Field(default=None, description="inline problem with hidden tests")
    reward: Literal["fraction", "all"] = Field(
        default="all",
        description="all: 1 only when every test passes; fraction: the share passed (a constant-returning "
        "function earns partial credit on most problems)",
    )
    timeout_s: float = Field(default=20.0, gt=0, le=600, description="wall-clock limit of the test run")
    max_turns: int = Field(default=4, ge=1, le=50)

    @field_validator("problem_id")
    @classmethod
    def _shipped(cls, value: str | None) -> str | None:
        # A field validator, so the 422 names problem_id (a model validator's error has no field).
        if value is not None and value not in problems_by_id():
            raise ValueError(f"unknown problem_id {value!r}; GET /v1/tasks?type=code lists the shipped ones")
        return value

    @model_validator(mode="after")
    def _one_source(self) -> CodeConfig:
        if (self.problem_id is None) == (self.problem is None):
            raise ValueError("give exactly one of problem_id or problem")
        return self

    def resolve(self) -> CodeProblem:
        if self.problem is not None:
            return self.problem
        assert self.problem_id is not None  # checked by the validator
        return problems_by_id()[self.problem_id]


@cache
def problems_by_id() -> dict[str, CodeProblem]:
    rows = DATA_PATH.read_text(encoding="utf-8").splitlines()
    problems = (CodeProblem.model_validate(json.loads(row)) for row in rows if row.strip())
    return {p.id: p for p in problems}


def list_problems() -> list[CodeProblem]:
    return list(problems_by_id().values())


def sample_configs(n: int, *, seed: int = 0) -> list[dict[str, str]]:
    """``n`` task configs (``{"problem_id": ...}``) drawn without replacement, reproducibly."""
    pool = list_problems()
    return [{"problem_id": p.id} for p in random.Random(seed).sample(pool, min(n, len(pool)))]


def shipped() -> list[dict[str, Any]]:
    """The shipped problems as the API's task list serves them (``GET /v1/tasks``)."""
    return [{"id": p.id, "config": {"problem_id": p.id}, "about": p.entry_point} for p in list_problems()]
