"""What a handler's stages hand on: RUN's token-exact trajectory and how the episode ended, EVAL's reward."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, Field, field_validator, model_validator

from farm.constants import Outcome
from farm.schemas.arrays import VersionSpan


class SegmentData(BaseModel):
    """One token sequence in which every model turn extended the one before: what the model saw and
    sampled, ids exactly as the backend returned them."""

    token_ids: list[int]
    logprobs: list[float]
    loss_mask: list[int]
    turn_offsets: list[int] = Field(default_factory=list)
    #: which weights sampled which tokens (see ``VersionSpan``); empty when nothing was sampled.
    weight_versions: list[VersionSpan] = Field(default_factory=list)

    @field_validator("loss_mask")
    @classmethod
    def _mask_is_binary(cls, value: list[int]) -> list[int]:
        if any(m not in (0, 1) for m in value):
            raise ValueError("loss_mask holds only 0 and 1")
        return value

    @model_validator(mode="after")
    def _one_entry_per_token(self) -> SegmentData:
        n = len(self.token_ids)
        if len(self.logprobs) != n or len(self.loss_mask) != n:
            raise ValueError(
                f"token_ids, logprobs and loss_mask must have one entry per token "
                f"(got {n}, {len(self.logprobs)}, {len(self.loss_mask)})"
            )
        at = 0
        for version, start, end in self.weight_versions:
            if not at <= start < end <= n or version < 0:
                raise ValueError(f"weight_versions: span {[version, start, end]} is not in order within {n} tokens")
            at = end
        return self


class TrajectoryData(SegmentData):
    """What a handler's RUN produces: the token-exact episode.

    The arrays are the episode's main segment (the one holding its last model turn). An episode whose
    chat template rewrote earlier turns under the ``template`` history policy has more than one
    segment: the others are in ``segments``, in the order they were made, so a trainer gets every id
    the model sampled (docs/proxy.md#history-exact-or-template).
    """

    info: dict[str, Any] = Field(default_factory=dict)
    segments: list[SegmentData] = Field(default_factory=list)


class RunResult(BaseModel):
    """What RUN hands on: the trajectory, how the episode ended, and state for EVAL."""

    trajectory: TrajectoryData
    outcome: Outcome = Outcome.OK
    reason: str | None = None
    state: dict[str, Any] = Field(default_factory=dict)


class EvalResult(BaseModel):
    reward: float
    metrics: dict[str, float] = Field(default_factory=dict)
    info: dict[str, Any] = Field(default_factory=dict)
