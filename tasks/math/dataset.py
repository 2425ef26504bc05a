"""The math task spec (``MathConfig``) and the shipped problems."""

from __future__ import annotations

import json
import random
from functools import cache
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from tasks.budget import EpisodeBudget

DATA_PATH = Path(__file__).parent / "data" / "problems.jsonl"


class MathProblem(BaseModel):
    """One problem with its reference answer (LaTeX or plain)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    id: str
    category: str
    problem: str
    answer: str

    def instruction(self) -> str:
        """The text shown to the model; the grader reads the last \\boxed{} first (see tasks.math.extract)."""
        return f"{self.problem}\n\nGive your final answer as \\boxed{{...}}."


class MathConfig(EpisodeBudget):
    """What a trainer submits: a shipped ``problem_id``, or an inline ``problem`` with its ``answer``."""

    model_config = ConfigDict(extra="forbid")

    problem_id: str | None = Field(default=None, max_length=200, description="id of a shipped problem")
    problem: str | None = Field(default=None, min_length=1, max_length=20_000)
    answer: str | None = Field(default=None, min_length=1, max_length=500, description="reference answer")
    max_turns: int = Field(default=1, ge=1, le=50, description="turns the agent may take before answering")

    @field_validator("problem_id")
    @classmethod
    def _shipped(cls, value: str | None) -> str | None:
        # A field validator, so the 422 names problem_id (a model validator's error has no field).
        if value is not None and value not in problems_by_id():
            raise ValueError(f"unknown problem_id {value!r}; GET /v1/tasks?type=math lists the shipped ones")
        return value

    @model_validator(mode="after")
    def _one_source(self) -> MathConfig:
        if self.problem_id is not None:
            if self.problem is not None or self.answer is not None:
                raise ValueError("give either problem_id or problem + answer, not both")
        elif self.problem is None or self.answer is None:
            raise ValueError("give problem_id, or both problem and answer")
        return self

    def resolve(self) -> MathProblem:
        """The problem this config names."""
        if self.problem_id is not None:
            return problems_by_id()[self.problem_id]
        assert self.problem is not None and self.answer is not None  # checked by the validator
        return MathProblem(id="inline", category="inline", problem=self.problem, answer=self.answer)


@cache
def problems_by_id() -> dict[str, MathProblem]:
    rows = DATA_PATH.read_text(encoding="utf-8").splitlines()
    problems = (MathProblem.model_validate(json.loads(row)) for row in rows if row.strip())
    return {p.id: p for p in problems}


def list_problems(*, category: str | None = None) -> list[MathProblem]:
    return [p for p in problems_by_id().values() if category is None or p.category == category]


def sample_configs(n: int, *, seed: int = 0, category: str | None = None) -> list[dict[str, str]]:
    """``n`` task configs (``{"problem_id": ...}``) drawn without replacement, reproducibly."""
    pool = list_problems(category=category)
    return [{"problem_id": p.id} for p in random.Random(seed).sample(pool, min(n, len(pool)))]


def shipped() -> list[dict[str, Any]]:
    """The shipped problems as the API's task list serves them (``GET /v1/tasks``)."""
    return [{"id": p.id, "config": {"problem_id": p.id}, "about": p.category} for p in list_problems()]
