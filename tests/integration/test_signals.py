"""``farm.signals`` against a real Redis: what workers, LLM sessions and proxies add is what
``/metrics`` and ``farm status`` read back."""

from __future__ import annotations

from typing import Any

import pytest

from farm import signals
from farm.schemas.stages import EvalResult, RunResult, TrajectoryData

pytestmark = pytest.mark.integration


def test_signals_an_episode_and_its_reward_read_back(redis_client: Any):
    # Given a RUN whose episode is prompt, model turn, observation, model turn (two turns, 5 sampled of 9).
    mask = [0, 0, 1, 1, 1, 0, 0, 1, 1]
    run = RunResult(trajectory=TrajectoryData(token_ids=list(range(9)), logprobs=[0.0] * 9, loss_mask=mask))
    # When RUN and EVAL are recorded, twice over.
    for _ in range(2):
        signals.episode_recorded(redis_client, "math", 42, run, None)
        signals.episode_recorded(redis_client, "math", 42, None, EvalResult(reward=0.5))
    # Then the histograms and counters hold both episodes, and the batch its tokens.
    hists = {(h.family, h.labels["type"]): h for h in signals.read_histograms(redis_client)}
    turns, length, reward = (hists[f, "math"] for f in ("farm_episode_turns", "farm_episode_tokens", "farm_reward"))
    assert (turns.count, turns.sum) == (2, 4.0) and turns.buckets[signals.TURN_BUCKETS.index(2)] == 2
    assert (length.count, length.sum) == (2, 18.0)
    assert (reward.count, reward.sum) == (2, 1.0) and reward.buckets[signals.REWARD_BUCKETS.index(0.5)] == 2
    counters = signals.read_counters(redis_client, ["farm_sampled_tokens_total", "farm_prompt_tokens_total"])
    assert counters["farm_sampled_tokens_total"] == [({"type": "math"}, 10)]
    assert counters["farm_prompt_tokens_total"] == [({"type": "math"}, 8)]
    assert signals.batch_tokens(redis_client, 42) == {"sampled": 10, "prompt": 8}
    assert 0 < redis_client.ttl(f"farm:metrics:batch:{42}") <= signals.BATCH_TTL_S


def test_signals_backend_tokens_per_second_over_the_last_minute(redis_client: Any):
    now = 1_000_000.0
    tally = signals.Tally()
    tally.backend_tokens("b0", prompt=100, sampled=300, now=now - 30)
    tally.backend_tokens("b0", prompt=100, sampled=600, now=now - 5)
    tally.backend_tokens("b0", prompt=100, sampled=9_999, now=now - 600)  # long gone: not recent
    merged = signals.Tally()
    merged.merge(tally)  # a proxy adds each call's session tally to its own
    merged.send(redis_client)
    assert merged.empty()
    assert signals.recent_tokens_per_s(redis_client, ["b0", "b1"], now=now) == {"b0": 900 / 60, "b1": 0.0}
    counters = signals.read_counters(redis_client, ["farm_backend_sampled_tokens_total"])
    assert counters["farm_backend_sampled_tokens_total"] == [({"backend": "b0"}, 10_899)]


def test_signals_model_turns_are_runs_of_sampled_tokens():
    assert [signals.model_turns(m) for m in ([], [0, 0], [1], [0, 1, 1, 0, 1], [1, 0, 1, 0, 1])] == [0, 0, 1, 2, 3]
