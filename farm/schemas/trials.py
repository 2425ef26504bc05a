"""Trials: one harness episode behind the proxy, its calls, and its record."""

from __future__ import annotations

from typing import Any, Literal, get_args

from pydantic import BaseModel, ConfigDict, Field, model_validator

from farm.schemas.arrays import ArrayEncoding, B64Array, VersionSpan
from farm.schemas.stages import TrajectoryData
from farm.schemas.stored import INT64_MAX, INT64_MIN, METADATA_ABOUT, StoredMetadata, StoredStr, WholeInt

#: a trial id appears in the proxy's URLs.
TRIAL_ID_PATTERN = r"^[A-Za-z0-9._-]{1,64}$"

#: what a call's prompt is when the chat template renders earlier turns differently once more follows
#: them (Qwen3 drops past reasoning): ``exact`` keeps every id the model sampled and appends the
#: template's rendering of the new messages (one segment); ``template`` is what the template renders
#: (a new segment where that differs). docs/proxy.md#history-exact-or-template says why ``exact`` is the default.
TrialHistory = Literal["exact", "template"]
HISTORY_POLICIES: tuple[str, ...] = get_args(TrialHistory)
DEFAULT_HISTORY: TrialHistory = "exact"


class TrialSampling(BaseModel):
    """Sampling a trial imposes on every call, whatever the harness asks for (unset: the harness's)."""

    model_config = ConfigDict(extra="forbid")

    temperature: float | None = Field(default=None, ge=0.0, le=10.0)
    top_p: float | None = Field(default=None, gt=0.0, le=1.0)
    top_k: WholeInt | None = Field(default=None, ge=-1, json_schema_extra={"not": {"const": 0}}, description="-1: off")
    max_tokens: WholeInt | None = Field(default=None, ge=1, le=1_000_000)
    seed: WholeInt | None = Field(default=None, ge=INT64_MIN, le=INT64_MAX)

    @model_validator(mode="after")
    def _top_k_not_zero(self) -> TrialSampling:
        if self.top_k == 0:
            raise ValueError("top_k must be -1 (off) or >= 1")
        return self


class TrialCreate(BaseModel):
    """A trial: one harness episode behind the proxy, with a key of its own."""

    model_config = ConfigDict(extra="forbid")

    id: str | None = Field(default=None, pattern=TRIAL_ID_PATTERN, description="default: a random id")
    job_id: WholeInt | None = Field(default=None, ge=1, le=INT64_MAX, description="the job whose rollout this is")
    model: StoredStr | None = Field(default=None, min_length=1, max_length=500, description="the model name to list")
    sampling: TrialSampling = Field(default_factory=TrialSampling)
    history: TrialHistory = Field(
        default=DEFAULT_HISTORY,
        description="exact: every sampled id is kept and only the new messages are rendered (one segment); "
        "template: the prompt is what the chat template renders (a new segment where it rewrites earlier turns)",
    )
    metadata: StoredMetadata = Field(default_factory=dict, description=METADATA_ABOUT)


class TrialCreated(BaseModel):
    id: str
    key: str = Field(description="the harness's API key for this trial; shown once")
    openai_base_url: str = Field(description="OPENAI_BASE_URL for the harness")
    anthropic_base_url: str = Field(description="ANTHROPIC_BASE_URL for the harness")


class TrialOut(BaseModel):
    """A trial and its continuity certificate: one entry per call."""

    id: str
    job_id: int | None
    model: str
    sampling: dict[str, Any]
    history: TrialHistory = DEFAULT_HISTORY
    calls: int
    segments: int
    created_at: str
    ended_at: str | None
    incomplete: str | None = Field(description="why the record is not whole; such a trial is not trainable")
    metadata: dict[str, Any]
    certificate: list[dict[str, Any]] = Field(default_factory=list)


class TrialCallOut(BaseModel):
    """One call of a trial: its certificate entry and the reply the harness was given."""

    model_config = ConfigDict(extra="allow")

    seq: int
    segment: int
    state: str
    reply: dict[str, Any] | None


class SegmentOut(BaseModel):
    """One segment of a trial's record: a token sequence in which every call extended the one before."""

    index: int
    calls: list[int]
    num_tokens: int
    token_ids: list[int] | B64Array
    logprobs: list[float] | B64Array
    loss_mask: list[int] | B64Array
    spans: list[list[Any]] = Field(description="[kind, start, end, call] per span; kind is prompt, env or model")
    weight_versions: list[VersionSpan] = Field(
        default_factory=list, description="[version, start, end] over the segment's own model tokens"
    )


class TrialRecord(TrialOut):
    encoding: ArrayEncoding
    segment_tokens: list[SegmentOut] = Field(default_factory=list)


class TrialRecordData(BaseModel):
    """A finished trial's record as a stage reads it: one trajectory per segment, oldest first."""

    trial_id: str
    segments: list[TrajectoryData]
    #: the segment that holds the trial's last answered call: the harness's final conversation.
    main: int | None
    certificate: list[dict[str, Any]]
    incomplete: str | None = None
