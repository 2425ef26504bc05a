"""Batches' sampling parameters and history policy, cached per worker process.

They never change once a batch is committed, yet every claim used to join the batch row and
validate them again. (A group's task config travels with the claim's own UPDATE instead:
groups are often a single job, so a per-group cache would rarely be hit.)
"""

from __future__ import annotations

import threading
from typing import Any, NamedTuple

from farm.schemas import SamplingParams
from farm.schemas.trials import TrialHistory

#: batches remembered per process.
DEFAULT_SAMPLING_CACHE_SIZE = 1_000


class BatchSettings(NamedTuple):
    """What every stage of a batch is handed besides its job: sampling, the history policy, the
    limits it set (``BatchLimits`` as stored; None: the farm's) and whether it has a quorum."""

    sampling: SamplingParams
    history: TrialHistory
    limits: dict[str, Any] | None = None
    has_quorum: bool = False


class SamplingCache:
    """Batch settings (``BatchSettings``) by batch id for one database; the oldest entries go first when full.

    Batch ids are never reused in a database (batches are not deleted while workers run), so
    an entry stays right for the life of the process."""

    def __init__(self, *, size: int = DEFAULT_SAMPLING_CACHE_SIZE) -> None:
        self._size = size
        self._data: dict[int, BatchSettings] = {}
        self._lock = threading.Lock()

    def get(self, batch_id: int) -> BatchSettings | None:
        return self._data.get(batch_id)

    def put(self, batch_id: int, sampling: BatchSettings) -> None:
        with self._lock:
            if batch_id not in self._data and len(self._data) >= self._size:
                del self._data[next(iter(self._data))]
            self._data[batch_id] = sampling
