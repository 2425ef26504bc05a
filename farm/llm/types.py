"""Token-in/token-out request and result types shared by every backend client and the built-in server."""

from __future__ import annotations

from enum import StrEnum

from pydantic import BaseModel, Field, model_validator

# One sampling model for the whole farm: what a batch asks for is what each turn sends.
from farm.schemas import SamplingParams, VersionSpan

#: vLLM's and OpenAI's default for /v1/completions when max_tokens is omitted (the built-in server).
DEFAULT_MAX_TOKENS = 16


class BackendKind(StrEnum):
    """Which wire protocol a backend speaks. The built-in CPU backend speaks vLLM's."""

    VLLM = "vllm"
    SGLANG = "sglang"
    BUILTIN = "builtin"


#: a map of token id -> logprob: the most likely tokens at one sampled position, most likely first.
TopLogprobs = dict[int, float]


class GenerateRequest(BaseModel):
    """One generation: a token-id prompt and how to sample its continuation.

    ``top_logprobs`` asks for the ``k`` most likely tokens at each sampled position (0: none, and
    nothing extra is computed or sent). It is not a sampling parameter: a batch never sets it.
    """

    prompt_token_ids: list[int] = Field(min_length=1)
    sampling: SamplingParams = Field(default_factory=SamplingParams)
    top_logprobs: int = Field(default=0, ge=0)


class FinishReason(StrEnum):
    STOP = "stop"  # an EOS or stop token id was sampled (it is the last sampled id)
    LENGTH = "length"  # max_tokens or the context length was reached
    ABORT = "abort"


class GenerateResult(BaseModel):
    """What a backend sampled, exactly: ids and the logprob of each under the unmodified distribution.

    ``queue_s`` is the time from sending the request until the backend started it where the backend
    reports it (the built-in backend does; 0.0 otherwise); ``latency_s`` is the client-side wall time.
    """

    token_ids: list[int]
    logprobs: list[float]
    finish_reason: FinishReason
    prompt_tokens: int
    backend_id: str
    latency_s: float = 0.0
    queue_s: float = 0.0
    #: prompt tokens the backend served from its prefix cache, where it says so.
    cached_tokens: int | None = None
    #: ``(version, start, end)`` over ``token_ids``: which weights sampled which ids. Filled by the
    #: backend where it says so (vLLM's ``weight_versions``), else by the session from the version
    #: the backend was registered with when the request went out.
    weight_versions: list[VersionSpan] = Field(default_factory=list)
    #: per sampled id, the request's ``top_logprobs`` most likely tokens; None when none were asked for.
    top_logprobs: list[TopLogprobs] | None = None

    @model_validator(mode="after")
    def _aligned(self) -> GenerateResult:
        if len(self.token_ids) != len(self.logprobs):
            raise ValueError(f"{len(self.token_ids)} token ids but {len(self.logprobs)} logprobs")
        if self.top_logprobs is not None and len(self.top_logprobs) != len(self.token_ids):
            raise ValueError(f"{len(self.token_ids)} token ids but {len(self.top_logprobs)} top_logprobs")
        return self


class StreamDelta(BaseModel):
    """Ids a streamed generation sampled since the previous delta, with their logprobs (and their
    top logprobs when the request asked for them)."""

    token_ids: list[int]
    logprobs: list[float]
    top_logprobs: list[TopLogprobs] | None = None


__all__ = [
    "DEFAULT_MAX_TOKENS",
    "BackendKind",
    "FinishReason",
    "GenerateRequest",
    "GenerateResult",
    "SamplingParams",
    "StreamDelta",
    "TopLogprobs",
]
