"""Streamed generations: server-sent events from vLLM (and the built-in backend) as sampled ids.

Shapes from vLLM 0.32 (``openai/completion/serving.py`` and ``scale_out/token_in_token_out/serving.py``):
each ``data:`` line is a JSON chunk whose ``choices[0]`` carries the ids sampled since the previous
chunk (``token_ids``; on ``/v1/completions`` only with ``return_token_ids``, else the ``token_id:N``
names of ``logprobs.tokens``) and their logprobs; the last choice has a ``finish_reason``; a chunk
with no choices carries the ``usage``; ``data: [DONE]`` ends the stream. An error mid-stream is a
chunk with an ``error`` object.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

import httpx

from farm.errors import UpstreamError
from farm.llm.parse import parse_completion, parse_generate, weight_versions
from farm.llm.types import FinishReason, GenerateRequest, GenerateResult, StreamDelta, TopLogprobs

_TOKEN_ID_PREFIX = "token_id:"


async def events(response: httpx.Response, backend: str) -> AsyncIterator[dict[str, Any]]:
    """The JSON chunks of a server-sent-events answer, until ``[DONE]``.

    Raises:
        UpstreamError: a chunk that is not JSON, or an error chunk.
    """
    async for line in response.aiter_lines():
        if not line.startswith("data:"):
            continue
        data = line[len("data:") :].strip()
        if data == "[DONE]":
            return
        try:
            chunk = json.loads(data)
        except ValueError as exc:
            raise UpstreamError(f"LLM backend streamed malformed JSON: {data[:200]!r}", backend=backend) from exc
        if not isinstance(chunk, dict):
            raise UpstreamError(f"LLM backend streamed a chunk that is not an object: {data[:200]!r}", backend=backend)
        if "error" in chunk:
            error = chunk["error"]
            message = error.get("message") if isinstance(error, dict) else error
            raise UpstreamError(f"LLM backend failed mid-stream: {message}", backend=backend)
        yield chunk


@dataclass
class Collected:
    """What a stream has said so far, to build the final ``GenerateResult`` the same way a
    non-streamed answer is built."""

    api: str
    #: the request's ``top_logprobs`` (0: none asked for, none read).
    top_logprobs: int = 0
    token_ids: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    tops: list[TopLogprobs] = field(default_factory=list)
    finish_reason: Any = None
    stop_reason: Any = None
    weight_versions: Any = None
    usage: Any = None
    queue_ms: Any = None

    def add(self, chunk: dict[str, Any], backend: str) -> StreamDelta | None:
        """Take one chunk; returns the ids it adds (None for a chunk that adds none)."""
        if isinstance(chunk.get("usage"), dict):
            self.usage = chunk["usage"]
        metrics = chunk.get("metrics")
        if isinstance(metrics, dict) and "queue_time_ms" in metrics:
            self.queue_ms = metrics["queue_time_ms"]
        choices = chunk.get("choices")
        if not isinstance(choices, list) or not choices:
            return None
        choice = choices[0]
        if not isinstance(choice, dict):
            raise UpstreamError("LLM backend streamed a choice that is not an object", backend=backend)
        as_result = self._one_choice_result(choice, backend)
        if choice.get("finish_reason") is not None:
            self.finish_reason = choice["finish_reason"]
            self.stop_reason = choice.get("stop_reason")
        if choice.get("weight_versions") is not None:
            self.weight_versions = choice["weight_versions"]
        ids, logprobs, tops = as_result
        if not ids:
            return None
        self.token_ids += ids
        self.logprobs += logprobs
        if tops is not None:
            self.tops += tops
        return StreamDelta(token_ids=ids, logprobs=logprobs, top_logprobs=tops)

    def _one_choice_result(
        self, choice: dict[str, Any], backend: str
    ) -> tuple[list[int], list[float], list[TopLogprobs] | None]:
        """A streamed choice read by the same parser as a whole answer (one choice, no usage)."""
        ids = choice.get("token_ids")
        if self.api == "completions" and not ids and not (choice.get("logprobs") or {}).get("tokens"):
            return [], [], None
        if self.api == "generate" and not ids:
            return [], [], None
        probe = {**choice, "finish_reason": choice.get("finish_reason") or "abort"}
        request = GenerateRequest(prompt_token_ids=[0], top_logprobs=self.top_logprobs)
        parse = parse_completion if self.api == "completions" else parse_generate
        part = parse({"choices": [probe]}, request, backend, 0.0)
        return part.token_ids, part.logprobs, part.top_logprobs

    def result(self, request: GenerateRequest, backend: str, latency_s: float) -> GenerateResult:
        """The whole generation, as the non-streamed answer would have given it.

        Raises:
            UpstreamError: the stream ended without a finish reason (the backend went away).
        """
        if self.finish_reason is None:
            raise UpstreamError("LLM backend's stream ended without a finish_reason", backend=backend)
        try:
            reason = FinishReason(str(self.finish_reason))
        except ValueError as exc:
            raise UpstreamError(f"LLM backend sent an unknown finish_reason {self.finish_reason!r}") from exc
        if not self.token_ids and reason is not FinishReason.ABORT:
            raise UpstreamError("LLM backend sampled no token", backend=backend)
        details = (self.usage or {}).get("prompt_tokens_details") if isinstance(self.usage, dict) else None
        cached = details.get("cached_tokens") if isinstance(details, dict) else None
        return GenerateResult(
            token_ids=self.token_ids,
            logprobs=self.logprobs,
            finish_reason=reason,
            prompt_tokens=len(request.prompt_token_ids),
            backend_id=backend,
            latency_s=latency_s,
            queue_s=float(self.queue_ms) / 1000.0 if isinstance(self.queue_ms, int | float) else 0.0,
            cached_tokens=cached if isinstance(cached, int) else None,
            weight_versions=weight_versions(self.weight_versions, len(self.token_ids)),
            top_logprobs=self.tops if self.top_logprobs else None,
        )
