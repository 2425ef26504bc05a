"""Sampling one token from a logits row, vLLM-style: raw logprobs, then temperature, top-k, top-p.

A forced token (a scripted reply) skips the sampling and is reported with the same raw logprob.
"""

from __future__ import annotations

import torch

from farm.llm.types import SamplingParams

#: temperatures below this sample greedily, as vLLM's ``_SAMPLING_EPS``: dividing by a tinier one
#: overflows the logits to inf, and softmax then gives NaN.
GREEDY_BELOW = 1e-5


def sample_token(
    logits: torch.Tensor,
    params: SamplingParams,
    generator: torch.Generator,
    num_top: int = 0,
    *,
    forced: int | None = None,
) -> tuple[int, float, dict[int, float]]:
    """Pick the next token.

    Args:
        logits: the model's unmodified logits for one position, shape ``(vocab,)``.
        params: temperature (0 = greedy), top_k (-1 = off), top_p.
        generator: the request's own generator, so a seed reproduces a request whatever runs beside it.
        num_top: how many of the most likely tokens to report with their logprobs.
        forced: the token to take instead of sampling one (scripted replies).

    Returns:
        The token id, its logprob under ``log_softmax(logits)`` and the top ``num_top`` logprobs.
    """
    logprobs = torch.log_softmax(logits.float(), dim=-1)
    if forced is not None:
        token = forced
    elif params.temperature < GREEDY_BELOW:
        token = int(torch.argmax(logits).item())
    else:
        scaled = logits.float() / params.temperature
        if params.top_k > 0 and params.top_k < scaled.numel():
            kth = torch.topk(scaled, params.top_k).values[-1]
            scaled = scaled.masked_fill(scaled < kth, float("-inf"))
        if params.top_p < 1.0:
            sorted_logits, order = torch.sort(scaled, descending=True)
            probs = torch.softmax(sorted_logits, dim=-1)
            # Drop a token when the tokens ranked before it already cover top_p; the first always stays.
            drop = (probs.cumsum(-1) - probs) >= params.top_p
            # Said, not left to the sums: a top_p below float32's least (1e-300) compares as 0, which
            # would drop every token and leave nothing to sample (the proxy fuzz found it: a 502).
            drop[0] = False
            scaled = scaled.scatter(0, order[drop], float("-inf"))
        probs = torch.softmax(scaled, dim=-1)
        token = int(torch.multinomial(probs, 1, generator=generator).item())
    top: dict[int, float] = {}
    if num_top:
        values, ids = torch.topk(logprobs, min(num_top, logprobs.numel()))
        top = {int(i): float(v) for i, v in zip(ids.tolist(), values.tolist(), strict=True)}
    return token, float(logprobs[token].item()), top
