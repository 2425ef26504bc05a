"""Turn vLLM and SGLang response bodies into ``GenerateResult``; anything unexpected is an ``UpstreamError``."""

from __future__ import annotations

from typing import Any

from farm.errors import UpstreamError
from farm.llm.types import FinishReason, GenerateRequest, GenerateResult, TopLogprobs
from farm.schemas import VersionSpan

_TOKEN_ID_PREFIX = "token_id:"


def _finish(value: Any, backend: str) -> FinishReason:
    if value is None:
        return FinishReason.STOP  # vLLM's default when the engine reports none
    try:
        return FinishReason(str(value))
    except ValueError as exc:
        raise UpstreamError(f"LLM backend sent an unknown finish_reason {value!r}", backend=backend) from exc


def _floats(values: Any, backend: str) -> list[float]:
    if not isinstance(values, list) or any(not isinstance(v, int | float) or isinstance(v, bool) for v in values):
        raise UpstreamError("LLM backend sent logprobs that are not all numbers", backend=backend)
    return [float(v) for v in values]


def _ints(values: Any, backend: str) -> list[int]:
    if not isinstance(values, list) or any(not isinstance(v, int) or isinstance(v, bool) for v in values):
        raise UpstreamError("LLM backend sent token ids that are not all integers", backend=backend)
    return list(values)


def _queue_s(data: dict[str, Any]) -> float:
    metrics = data.get("metrics")
    if isinstance(metrics, dict) and isinstance(metrics.get("queue_time_ms"), int | float):
        return float(metrics["queue_time_ms"]) / 1000.0
    return 0.0


def _cached(usage: Any) -> int | None:
    if isinstance(usage, dict) and isinstance(usage.get("prompt_tokens_details"), dict):
        value = usage["prompt_tokens_details"].get("cached_tokens")
        return int(value) if isinstance(value, int) else None
    return None


def weight_versions(value: Any, num_tokens: int) -> list[VersionSpan]:
    """vLLM's ``weight_versions`` (``[{"version", "start", "end"}]`` over the output ids) as farm spans.

    The farm's versions are integers it sets itself (``/update_weight_version``); spans it cannot read
    as such, or that do not cover the ids in order, give ``[]``: the session then stamps the turn
    with the version the backend was registered with, rather than trusting a label it cannot order.
    """
    if not isinstance(value, list) or not value:
        return []
    spans: list[VersionSpan] = []
    at = 0
    for item in value:
        if not isinstance(item, dict):
            return []
        version, start, end = item.get("version"), item.get("start"), item.get("end")
        if isinstance(version, str) and version.isdigit():
            version = int(version)
        if not all(isinstance(v, int) and not isinstance(v, bool) for v in (version, start, end)):
            return []
        assert isinstance(version, int) and isinstance(start, int) and isinstance(end, int)
        if start != at or end < start:
            return []
        if end > start:
            spans.append((version, start, end))
        at = end
    return spans if at == num_tokens else []


def best(candidates: TopLogprobs, k: int) -> TopLogprobs:
    """The ``k`` most likely of ``candidates``, most likely first (ties keep the server's order)."""
    return dict(sorted(candidates.items(), key=lambda item: -item[1])[:k])


def _top_maps(rows: Any, num: int, k: int, backend: str, read: Any) -> list[TopLogprobs]:
    """One id -> logprob map per sampled id, from a server's per-position ``rows`` read by ``read``
    (a row -> [(id, logprob)]), cut to the ``k`` most likely.

    Raises:
        UpstreamError: the rows are missing, one per id they are not, or an entry is malformed.
    """
    if not isinstance(rows, list) or len(rows) != num:
        raise UpstreamError(
            f"LLM backend sent no top logprobs for each of the {num} sampled ids (top logprobs ignored?)",
            backend=backend,
        )
    maps: list[TopLogprobs] = []
    for row in rows:
        try:
            pairs = read(row)
            candidates = {int(t): float(v) for t, v in pairs}
        except (TypeError, ValueError, KeyError, IndexError) as exc:
            raise UpstreamError(
                f"LLM backend sent a malformed top logprobs entry: {row!r:.200}", backend=backend
            ) from exc
        if any(isinstance(t, bool) or isinstance(v, bool) for t, v in pairs):
            raise UpstreamError(f"LLM backend sent a malformed top logprobs entry: {row!r:.200}", backend=backend)
        maps.append(best(candidates, k))
    return maps


def _completion_pairs(row: Any) -> list[tuple[int, float]]:
    # vLLM's completions map: "token_id:N" -> logprob, the sampled id first, then the requested top-k.
    if not isinstance(row, dict):
        raise TypeError(row)
    pairs = []
    for name, value in row.items():
        if not isinstance(name, str) or not name.startswith(_TOKEN_ID_PREFIX):
            raise ValueError(name)
        pairs.append((int(name[len(_TOKEN_ID_PREFIX) :]), value))
    return pairs


def _generate_pairs(row: Any) -> list[tuple[int, float]]:
    # vLLM's tokens route: a content entry's ``top_logprobs`` list of {"token_id", "logprob", "rank"}.
    tops = row["top_logprobs"]
    if not isinstance(tops, list):
        raise TypeError(tops)
    return [(entry["token_id"], entry["logprob"]) for entry in tops]


def _sglang_pairs(row: Any) -> list[tuple[int, float]]:
    # SGLang: a position's list of [logprob, id, text-or-null] (None for a position without any).
    if not isinstance(row, list):
        raise TypeError(row)
    return [(entry[1], entry[0]) for entry in row]


def _first_choice(data: dict[str, Any], backend: str) -> dict[str, Any]:
    choices = data.get("choices")
    if not isinstance(choices, list) or not choices or not isinstance(choices[0], dict):
        raise UpstreamError("LLM backend response has no choices", backend=backend)
    return choices[0]


def parse_completion(data: dict[str, Any], request: GenerateRequest, backend: str, latency_s: float) -> GenerateResult:
    """vLLM ``/v1/completions``: ids from ``token_ids`` or, on older servers, from ``"token_id:N"`` names.

    Raises:
        UpstreamError: ids or logprobs missing, or the two disagree.
    """
    choice = _first_choice(data, backend)
    lp = choice.get("logprobs")
    if not isinstance(lp, dict):
        raise UpstreamError("LLM backend returned no logprobs (is `logprobs` supported?)", backend=backend)
    logprobs = _floats(lp.get("token_logprobs"), backend)
    named = lp.get("tokens")
    from_names: list[int] | None = None
    if isinstance(named, list) and all(isinstance(t, str) and t.startswith(_TOKEN_ID_PREFIX) for t in named):
        from_names = [int(t[len(_TOKEN_ID_PREFIX) :]) for t in named]
    if choice.get("token_ids") is not None:
        ids = _ints(choice["token_ids"], backend)
        if from_names is not None and from_names != ids:
            raise UpstreamError("LLM backend's token_ids and logprob token names disagree", backend=backend)
    elif from_names is not None:
        ids = from_names
    else:
        raise UpstreamError(
            "LLM backend returned neither token_ids nor token_id:N logprob names; it supports neither "
            "return_token_ids nor return_tokens_as_token_ids",
            backend=backend,
        )
    usage = data.get("usage")
    result = _result(ids, logprobs, choice.get("finish_reason"), request, backend, latency_s, data, usage)
    if request.top_logprobs:
        result.top_logprobs = _top_maps(
            lp.get("top_logprobs"), len(ids), request.top_logprobs, backend, _completion_pairs
        )
    return result


def parse_generate(data: dict[str, Any], request: GenerateRequest, backend: str, latency_s: float) -> GenerateResult:
    """vLLM ``/inference/v1/generate`` (output_mode ``tokens``).

    Raises:
        UpstreamError: ids or logprobs missing.
    """
    choice = _first_choice(data, backend)
    ids = _ints(choice.get("token_ids"), backend)
    lp = choice.get("logprobs")
    content = lp.get("content") if isinstance(lp, dict) else None
    if not isinstance(content, list) or not all(isinstance(c, dict) for c in content):
        raise UpstreamError("LLM backend returned no logprobs content", backend=backend)
    logprobs = _floats([c.get("logprob") for c in content], backend)
    result = _result(ids, logprobs, choice.get("finish_reason"), request, backend, latency_s, data, data.get("usage"))
    result.weight_versions = weight_versions(choice.get("weight_versions"), len(ids))
    if request.top_logprobs:
        result.top_logprobs = _top_maps(content, len(ids), request.top_logprobs, backend, _generate_pairs)
    return result


def parse_sglang(data: dict[str, Any], request: GenerateRequest, backend: str, latency_s: float) -> GenerateResult:
    """SGLang ``/generate``: ``output_ids`` and ``meta_info.output_token_logprobs`` ``[logprob, id, text]``.

    Raises:
        UpstreamError: ids or logprobs missing, or the two disagree.
    """
    meta = data.get("meta_info")
    if not isinstance(meta, dict):
        raise UpstreamError("SGLang response has no meta_info", backend=backend)
    triples = meta.get("output_token_logprobs")
    if not isinstance(triples, list) or not all(isinstance(t, list | tuple) and len(t) >= 2 for t in triples):
        raise UpstreamError("SGLang response has no output_token_logprobs (return_logprob ignored?)", backend=backend)
    logprobs = _floats([t[0] for t in triples], backend)
    ids = _ints([t[1] for t in triples], backend)
    if data.get("output_ids") is not None and _ints(data["output_ids"], backend) != ids:
        raise UpstreamError("SGLang output_ids and output_token_logprobs disagree", backend=backend)
    finish = meta.get("finish_reason")
    reason = finish.get("type") if isinstance(finish, dict) else finish
    cached = meta.get("cached_tokens")
    result = _result(ids, logprobs, reason, request, backend, latency_s, data, None)
    result.cached_tokens = cached if isinstance(cached, int) else None
    if request.top_logprobs:
        result.top_logprobs = _top_maps(
            meta.get("output_top_logprobs"), len(ids), request.top_logprobs, backend, _sglang_pairs
        )
    return result


def _result(
    ids: list[int],
    logprobs: list[float],
    finish: Any,
    request: GenerateRequest,
    backend: str,
    latency_s: float,
    data: dict[str, Any],
    usage: Any,
) -> GenerateResult:
    if len(ids) != len(logprobs):
        raise UpstreamError(f"LLM backend sent {len(ids)} token ids but {len(logprobs)} logprobs", backend=backend)
    reason = _finish(finish, backend)
    if not ids and reason is not FinishReason.ABORT:  # an aborted request may end before its first token
        raise UpstreamError("LLM backend sampled no token", backend=backend)
    return GenerateResult(
        token_ids=ids,
        logprobs=logprobs,
        finish_reason=reason,
        prompt_tokens=len(request.prompt_token_ids),
        backend_id=backend,
        latency_s=latency_s,
        queue_s=_queue_s(data),
        cached_tokens=_cached(usage),
    )
