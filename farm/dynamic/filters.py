"""Group filters: does a group of rewards teach the policy anything?

A filter takes the rewards of a group's scored samples and the batch's ``DynamicSampling`` options
and answers True for an informative group. Built in: ``std`` (the rewards are not all equal: GRPO's
advantages are all zero otherwise), ``mixed`` (at least one success and one failure, a success
being a reward of at least ``success_at``), ``min_spread`` (the best minus the worst reward is at
least ``min_spread``). Another package adds one through the ``farm.filters`` entry-point group
(``name = "package.module:function"``) without touching farm.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from functools import cache
from importlib.metadata import entry_points

from farm.errors import InvalidSpec
from farm.schemas import DynamicSampling

Filter = Callable[[Sequence[float], DynamicSampling], bool]
ENTRY_POINT_GROUP = "farm.filters"
#: filters that need at least two samples per group to ever pass.
SPREAD_FILTERS = frozenset({"std", "mixed", "min_spread"})


def std(rewards: Sequence[float], options: DynamicSampling) -> bool:
    return len(rewards) >= 2 and max(rewards) > min(rewards)


def mixed(rewards: Sequence[float], options: DynamicSampling) -> bool:
    successes = sum(r >= options.success_at for r in rewards)
    return 0 < successes < len(rewards)


def min_spread(rewards: Sequence[float], options: DynamicSampling) -> bool:
    return len(rewards) >= 2 and max(rewards) - min(rewards) >= max(options.min_spread, 1e-12)


BUILTIN: dict[str, Filter] = {"std": std, "mixed": mixed, "min_spread": min_spread}


def known_filters() -> list[str]:
    """Every filter name a batch may give: the built-in ones and the entry points'."""
    return sorted({*BUILTIN, *(ep.name for ep in entry_points(group=ENTRY_POINT_GROUP))})


@cache
def get_filter(name: str) -> Filter:
    """The filter registered under ``name``.

    Raises:
        InvalidSpec: no such filter (``field`` names it; the message lists the known ones).
    """
    if name in BUILTIN:
        return BUILTIN[name]
    found = {ep.name: ep for ep in entry_points(group=ENTRY_POINT_GROUP)}
    if name not in found:
        raise InvalidSpec(
            f"dynamic.filter: no filter named {name!r}; known: {', '.join(known_filters())}", field="dynamic.filter"
        )
    loaded: Filter = found[name].load()
    return loaded


def spread(rewards: Sequence[float]) -> tuple[float, float]:
    """Mean and population standard deviation."""
    mean = sum(rewards) / len(rewards)
    return mean, math.sqrt(sum((r - mean) ** 2 for r in rewards) / len(rewards))
