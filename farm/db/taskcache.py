"""What a job's group and batch fix for every stage of it, cached per worker process.

A group's task config and its batch's sampling parameters never change once committed, yet a
claim used to join both tables (and re-validate the sampling) for every stage of every job.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass
from typing import Any

from farm.schemas import SamplingParams

#: groups remembered per process; a batch of 10k tasks at 2 kB of config each is ~20 MB.
DEFAULT_TASK_CACHE_SIZE = 10_000


@dataclass(frozen=True)
class TaskData:
    """A group's config and its batch's sampling parameters (shared: copy before changing)."""

    config: dict[str, Any]
    sampling: SamplingParams


class TaskCache:
    """Task data by group id for one database; the oldest entries go first when it is full.

    Group ids are never reused in a database (rows are not deleted while workers run), so an
    entry stays right for the life of the process."""

    def __init__(self, *, size: int = DEFAULT_TASK_CACHE_SIZE) -> None:
        self._size = size
        self._data: dict[int, TaskData] = {}
        self._lock = threading.Lock()

    def get(self, group_id: int) -> TaskData | None:
        return self._data.get(group_id)

    def put(self, group_id: int, data: TaskData) -> None:
        with self._lock:
            if group_id not in self._data and len(self._data) >= self._size:
                del self._data[next(iter(self._data))]
            self._data[group_id] = data
