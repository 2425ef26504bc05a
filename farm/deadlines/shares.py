"""Time to a share of a batch: the tail figures the API, ``farm report`` and /metrics give (pure:
no database, so the report's client side can use it too)."""

from __future__ import annotations

import math
from collections.abc import Iterable
from datetime import datetime

#: the shares of a batch its tail is reported at.
SHARES = (0.5, 0.9, 0.99, 1.0)


def share_label(share: float) -> str:
    return f"{share * 100:g}%"


def seconds_to(created_at: datetime, finished: Iterable[datetime], total: int) -> dict[str, float | None]:
    """Seconds from ``created_at`` until each share of ``total`` jobs had finished (None: not yet)."""
    times = sorted(finished)
    out: dict[str, float | None] = {}
    for share in SHARES:
        k = max(1, math.ceil(share * total - 1e-9))
        out[share_label(share)] = (times[k - 1] - created_at).total_seconds() if len(times) >= k else None
    return out
