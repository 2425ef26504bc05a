"""The trainer-side client: needs only httpx, pydantic and numpy.

>>> from farm.client import FarmClient, to_arrays
>>> with FarmClient("http://farm:8700", token="...") as farm:
...     batch = farm.submit([{"type": "math", "config": {...}}], group_size=8)
...     for result in farm.results(batch.id):
...         ...

An error answer raises ``ApiError`` as the subclass that is also the farm error of its code:
``NotFound`` (404), ``InvalidSpec`` (422, ``field`` names what to fix), ``Conflict`` (409),
``Unauthorized`` (401), ``Unavailable`` (503: the farm's database or Redis; raised only once the
client's own retries, ``RetryPolicy``, are spent).
"""

from __future__ import annotations

from farm.client.arrays import TrajectoryArrays, decode_trajectory, to_arrays
from farm.client.client import AsyncFarmClient, FarmClient
from farm.client.retry import NO_RETRIES, RetryPolicy
from farm.client.steps import CarryCursor, Step
from farm.errors import (
    ApiError,
    Conflict,
    HandlerNotFound,
    InvalidSpec,
    NotFound,
    Unauthorized,
    Unavailable,
    UpstreamError,
)
from farm.schemas import (
    BatchLimits,
    DynamicSampling,
    GroupResult,
    JobResult,
    PassRateSkip,
    Quorum,
    SamplingParams,
    task_key,
)

__all__ = [
    "ApiError",
    "AsyncFarmClient",
    "BatchLimits",
    "CarryCursor",
    "Conflict",
    "DynamicSampling",
    "FarmClient",
    "GroupResult",
    "HandlerNotFound",
    "InvalidSpec",
    "JobResult",
    "NO_RETRIES",
    "NotFound",
    "PassRateSkip",
    "Quorum",
    "RetryPolicy",
    "SamplingParams",
    "Step",
    "TrajectoryArrays",
    "Unauthorized",
    "Unavailable",
    "UpstreamError",
    "decode_trajectory",
    "task_key",
    "to_arrays",
]
