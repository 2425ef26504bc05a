"""The math reward: 1.0 when the response's final answer equals the reference, else 0.0."""

from __future__ import annotations

import re
from typing import Any

from tasks.math.equivalence import DEFAULT_SYMBOLIC_TIMEOUT_S, equivalent
from tasks.math.extract import extract_answer, normalize

_SIDE_BY_SIDE = re.compile(r"\d\s+[\d.]")


def grade(
    response_text: str, reference: str, *, timeout_s: float = DEFAULT_SYMBOLIC_TIMEOUT_S
) -> tuple[float, dict[str, Any]]:
    """Score a response against a reference answer; never raises on the response's content.

    Returns:
        ``(reward, info)``; ``info`` holds ``extracted`` (raw answer or None), ``normalized``,
        ``reference`` (normalised) and ``reason`` (how equality was decided, or why not).
    """
    raw = extract_answer(response_text)
    want = normalize(reference)
    info: dict[str, Any] = {"extracted": raw, "normalized": None, "reference": want}
    if raw is None:
        info["reason"] = "no answer found"
        return 0.0, info
    got = normalize(raw)
    info["normalized"] = got
    if not got:
        info["reason"] = "empty answer"
        return 0.0, info
    if _SIDE_BY_SIDE.search(got):
        # sympy would read "3 4" as 3*4: two candidates must not score as their product.
        info["reason"] = "numbers side by side"
        return 0.0, info
    equal, why = equivalent(got, want, timeout_s=timeout_s)
    info["reason"] = why
    return (1.0 if equal else 0.0), info
