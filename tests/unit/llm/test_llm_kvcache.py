"""Prefix cache: longest common prefix wins, supersession, token-budget eviction."""

from __future__ import annotations

import torch

from farm.llm.builtin.kvcache import PrefixCache


def kv(n):
    return [torch.arange(n, dtype=torch.float32).view(1, n, 1)], [torch.zeros(1, n, 1)]


def test_lookup_returns_longest_common_prefix():
    cache = PrefixCache(max_tokens=100)
    cache.insert([1, 2, 3], *kv(3))
    cache.insert([1, 2, 9, 9, 9], *kv(5))
    n, keys, _ = cache.lookup([1, 2, 9, 9, 4, 4], max_len=10)
    assert n == 4
    assert keys[0].shape[1] == 5


def test_lookup_is_capped_by_max_len():
    cache = PrefixCache(max_tokens=100)
    cache.insert([1, 2, 3, 4], *kv(4))
    assert cache.lookup([1, 2, 3, 4], max_len=3)[0] == 3


def test_lookup_misses_on_different_first_token():
    cache = PrefixCache(max_tokens=100)
    cache.insert([1, 2, 3], *kv(3))
    assert cache.lookup([2, 2, 3], max_len=10)[0] == 0


def test_insert_drops_entries_it_extends():
    cache = PrefixCache(max_tokens=100)
    cache.insert([1, 2], *kv(2))
    cache.insert([1, 2, 3], *kv(3))
    assert len(cache) == 1
    assert cache.tokens == 3


def test_eviction_keeps_total_under_budget_dropping_least_recently_used():
    cache = PrefixCache(max_tokens=10)
    cache.insert([1, 1, 1, 1], *kv(4))
    cache.insert([2, 2, 2, 2], *kv(4))
    cache.lookup([1, 1, 1, 1, 5], max_len=4)  # touch the first entry
    cache.insert([3, 3, 3, 3], *kv(4))
    assert cache.tokens <= 10
    assert cache.lookup([2, 2, 2, 2], max_len=4)[0] == 0
    assert cache.lookup([1, 1, 1, 1], max_len=4)[0] == 4
