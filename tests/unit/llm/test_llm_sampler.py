"""Sampling: raw logprobs whatever the settings, greedy at temperature 0, filters, per-request seeds."""

from __future__ import annotations

import torch

from farm.llm.builtin.sampler import sample_token
from farm.llm.types import SamplingParams

LOGITS = torch.tensor([1.0, 3.0, 2.0, 0.5, -1.0])
RAW = torch.log_softmax(LOGITS, dim=-1)


def gen(seed=0):
    return torch.Generator().manual_seed(seed)


def test_sample_greedy_picks_argmax_with_raw_logprob():
    token, logprob, _ = sample_token(LOGITS, SamplingParams(temperature=0.0), gen())
    assert token == 1
    assert logprob == float(RAW[1])


def test_sample_a_vanishing_temperature_is_greedy_not_nan():
    # 1/1e-38 overflows the logits to inf: softmax would be NaN and multinomial would raise.
    for temperature in (1e-38, 2.2e-309, 1e-6):
        token, logprob, _ = sample_token(LOGITS * 50, SamplingParams(temperature=temperature), gen())
        assert token == 1 and logprob == float(torch.log_softmax(LOGITS * 50, dim=-1)[1])


def test_sample_logprob_ignores_temperature_and_filters():
    params = SamplingParams(temperature=0.3, top_k=2, top_p=0.5)
    for seed in range(20):
        token, logprob, _ = sample_token(LOGITS, params, gen(seed))
        assert logprob == float(RAW[token])


def test_sample_top_k_one_is_argmax():
    assert {sample_token(LOGITS, SamplingParams(top_k=1), gen(s))[0] for s in range(20)} == {1}


def test_sample_tiny_top_p_keeps_only_the_most_likely():
    assert {sample_token(LOGITS, SamplingParams(top_p=0.01), gen(s))[0] for s in range(20)} == {1}


def test_sample_top_k_two_never_picks_outside_the_two_best():
    picks = {sample_token(LOGITS, SamplingParams(top_k=2, temperature=5.0), gen(s))[0] for s in range(200)}
    assert picks == {1, 2}


def test_sample_same_seed_same_tokens():
    params = SamplingParams(temperature=2.0)
    first = [sample_token(LOGITS, params, g)[0] for g in [gen(7)] for _ in range(30)]
    g = gen(7)
    second = [sample_token(LOGITS, params, g)[0] for _ in range(30)]
    assert first == second
    assert len(set(first)) > 1


def test_sample_reports_top_logprobs():
    _, _, top = sample_token(LOGITS, SamplingParams(), gen(), num_top=2)
    assert top == {1: float(RAW[1]), 2: float(RAW[2])}


def test_sample_forced_token_reports_its_raw_logprob_and_tops():
    # The least likely token at a setting that could never sample it: forced ids bypass the filters.
    params = SamplingParams(temperature=0.0, top_k=1)
    token, logprob, top = sample_token(LOGITS, params, gen(), num_top=2, forced=4)
    assert token == 4
    assert logprob == float(RAW[4])
    assert top == {1: float(RAW[1]), 2: float(RAW[2])}
