"""The episode budget every agent task's config shares (``AgentHandler.budgets`` reads it)."""

from __future__ import annotations

from pydantic import BaseModel, Field


class EpisodeBudget(BaseModel):
    """How much an episode may spend beyond its turns (``max_turns``, whose default is each task's own)."""

    max_episode_tokens: int | None = Field(default=None, ge=1, description="tokens the agent may sample in all")
    keep_unseen_tail: bool = Field(
        default=False,
        description="keep the observation and generation prompt after the last model turn (never seen by the model)",
    )
    time_limit_s: float | None = Field(default=None, gt=0, description="wall-clock budget of the episode")
