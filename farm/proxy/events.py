"""The events of a proxy call (``ProxyCore.call``), in the order a format adapter reads them:
``Started``, then ``Sampled``/``ReasoningDelta``/``TextDelta``/``ToolCallEvent`` as the model
writes, then ``Finished``."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from farm.proxy.conversation import Reply, ToolCall


@dataclass(frozen=True)
class TrialContext:
    """A trial as a call sees it once its key opened it: the model name and the trainer's sampling."""

    id: str
    model: str
    sampling: dict[str, Any]
    #: its history policy (``farm.schemas.trials.TrialHistory``).
    history: str = "exact"


@dataclass(frozen=True)
class Started:
    """The backend has begun answering (the first event of every call)."""

    seq: int
    prompt_tokens: int


@dataclass(frozen=True)
class TextDelta:
    """Answer text, as the stop matcher and the tool-call parser let it out."""

    text: str


@dataclass(frozen=True)
class ReasoningDelta:
    """The model's reasoning, split from its answer by the trial's reasoning parser (none for a
    model that does not reason). It comes before the answer's text."""

    text: str


@dataclass(frozen=True)
class Sampled:
    """Tokens as the backend sampled them, for a streamed call that asked for logprobs: their texts,
    logprobs and (when asked for) their top logprobs as ``(text, logprob)``, most likely first. They
    come before the text they make, which the stop matcher and tool-call parser may still hold back."""

    token_texts: list[str]
    logprobs: list[float]
    top_logprobs: list[list[tuple[str, float]]]


@dataclass(frozen=True)
class ToolCallEvent:
    """A complete tool call; ``index`` counts the answer's calls from 0."""

    index: int
    call: ToolCall


@dataclass(frozen=True)
class Usage:
    """The call's token counts, as every format reports them."""

    prompt_tokens: int
    completion_tokens: int
    cached_tokens: int | None = None
    #: sampled tokens the reasoning parser read as reasoning (its tags not counted, as vLLM counts);
    #: None when the model has no reasoning parser (vLLM then reports no completion_tokens_details).
    reasoning_tokens: int | None = None

    @property
    def total_tokens(self) -> int:
        return self.prompt_tokens + self.completion_tokens


@dataclass(frozen=True)
class Finished:
    """The call's answer, yielded once its record is committed (the last event)."""

    reply: Reply
    usage: Usage
    seq: int
    token_ids: list[int]
    logprobs: list[float]
    #: each sampled token's text, for formats that return per-token logprobs.
    token_texts: list[str] = field(default_factory=list)
    #: the prompt's ids, for a format that returns them (``CompletionRequest.prompt_ids``).
    prompt_ids: list[int] = field(default_factory=list)
    #: per sampled token, when the request asked for top logprobs: the most likely tokens' texts and
    #: logprobs, most likely first.
    top_logprobs: list[list[tuple[str, float]]] = field(default_factory=list)
    #: the model's reasoning, split from ``reply.content`` (empty: none, or a model that does not reason).
    reasoning: str = ""


Event = Started | Sampled | ReasoningDelta | TextDelta | ToolCallEvent | Finished
