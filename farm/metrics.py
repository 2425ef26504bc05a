"""The figures only a running process sees, kept where the API's ``/metrics`` can read them.

``/metrics`` is computed when Prometheus scrapes it: job counts come from PostgreSQL (the truth),
queue depths and backend load from Redis as they are now. What happens inside a worker or the proxy
(how long a stage took, how a proxy call ended, how many sandboxes a node holds) is added to Redis
hashes here, one pipelined round trip per event (the proxy's recorded calls: one a second). Redis
may lose them: a counter that starts again at zero is a reset, which Prometheus's ``rate()``
already expects, and a node's sandbox count expires with the node.
"""

from __future__ import annotations

import json
import logging
from bisect import bisect_left
from collections.abc import Callable, Iterable, Mapping
from dataclasses import asdict, dataclass

from redis import Redis

log = logging.getLogger(__name__)

#: upper bounds (seconds) of the stage latency histogram: INIT takes ~0.1-5 s, RUN up to an hour.
STAGE_BUCKETS: tuple[float, ...] = (
    0.1,
    0.25,
    0.5,
    1.0,
    2.5,
    5.0,
    10.0,
    30.0,
    60.0,
    120.0,
    300.0,
    600.0,
    1800.0,
    3600.0,
)

_PREFIX = "farm:metrics:"
_STAGE = _PREFIX + "stage:"  # + stage + ":" + task type: a hash of bucket counts, sum and count
_STAGE_INDEX = _PREFIX + "stage-keys"
_PROXY = _PREFIX + "proxy-calls"  # outcome -> count
_SANDBOXES = _PREFIX + "sandboxes:"  # + node: the node's live sandboxes, expiring with the node
_WORKERS = _PREFIX + "worker:"  # + hostname + ":" + pid: a worker process, expiring with it


def record_stage(redis: Redis, stage: str, task_type: str, seconds: float) -> None:
    """One stage of one job ran for ``seconds`` (only stages whose result was recorded count)."""
    key = f"{_STAGE}{stage}:{task_type}"
    bucket = bisect_left(STAGE_BUCKETS, seconds)  # len(STAGE_BUCKETS) is +Inf

    def send() -> None:
        pipe = redis.pipeline(transaction=False)
        pipe.hincrby(key, f"b{bucket}", 1)
        pipe.hincrby(key, "count", 1)
        pipe.hincrbyfloat(key, "sum", seconds)
        pipe.sadd(_STAGE_INDEX, key)
        pipe.execute()

    _quietly(send)


def record_proxy_call(redis: Redis, outcome: str, count: int = 1) -> None:
    """``count`` proxy calls the model was asked for ended: ``ok`` (recorded) or ``failed`` (the
    backend, the database or the client's disconnect ended it)."""
    _quietly(lambda: redis.hincrby(_PROXY, outcome, count))


def record_sandboxes(redis: Redis, node: str, count: int, *, ttl_s: float) -> None:
    """``node`` holds ``count`` live sandboxes now; the figure lapses if nobody says it again."""
    _quietly(lambda: redis.set(f"{_SANDBOXES}{node}", count, px=max(1, int(ttl_s * 1000))))


@dataclass(frozen=True)
class WorkerProcess:
    """A worker process that said it is alive lately: which stages it serves with how many slots."""

    name: str
    node: str
    stages: tuple[str, ...]
    slots: int
    pid: int
    #: the most PostgreSQL connections its pools may open (``farm.db.budget``); 0: not said.
    db_connections: int = 0


def record_worker(redis: Redis, worker: WorkerProcess, *, ttl_s: float) -> None:
    key = f"{_WORKERS}{worker.name}:{worker.pid}"
    value = json.dumps({**asdict(worker), "stages": list(worker.stages)})
    _quietly(lambda: redis.set(key, value, px=max(1, int(ttl_s * 1000))))


def read_workers(redis: Redis) -> list[WorkerProcess]:
    keys = sorted(_text(k) for k in redis.scan_iter(match=f"{_WORKERS}*", count=1000))
    out = []
    for raw in redis.mget(keys) if keys else []:
        if raw is None:
            continue
        fields = json.loads(raw)
        out.append(WorkerProcess(**{**fields, "stages": tuple(fields["stages"])}))
    return out


def _quietly(send: Callable[[], object]) -> None:
    # A figure is never worth failing a stage or a call over.
    try:
        send()
    except Exception as exc:  # noqa: BLE001 - Redis away: the figure is lost, nothing else
        log.debug("metric not recorded: %s", exc)


@dataclass(frozen=True)
class StageHistogram:
    stage: str
    task_type: str
    buckets: tuple[int, ...]  # per bucket (not cumulative), the last one +Inf
    count: int
    sum: float


def read_indexed_hashes(redis: Redis, index: str) -> list[tuple[str, dict[str, str]]]:
    """Each hash the set ``index`` names, read in one round trip, by key (empty ones left out)."""
    keys = sorted(_text(k) for k in redis.smembers(index))
    if not keys:
        return []
    pipe = redis.pipeline(transaction=False)
    for key in keys:
        pipe.hgetall(key)
    return [
        (key, {_text(k): _text(v) for k, v in raw.items()})
        for key, raw in zip(keys, pipe.execute(), strict=True)
        if raw
    ]


def read_stage_histograms(redis: Redis) -> list[StageHistogram]:
    out = []
    for key, fields in read_indexed_hashes(redis, _STAGE_INDEX):
        stage, _, task_type = key.removeprefix(_STAGE).partition(":")
        buckets = tuple(int(fields.get(f"b{i}", 0)) for i in range(len(STAGE_BUCKETS) + 1))
        out.append(StageHistogram(stage, task_type, buckets, int(fields.get("count", 0)), float(fields.get("sum", 0))))
    return out


def read_proxy_calls(redis: Redis) -> dict[str, int]:
    return {_text(k): int(v) for k, v in redis.hgetall(_PROXY).items()}


def read_sandboxes(redis: Redis) -> dict[str, int]:
    keys = sorted(_text(k) for k in redis.scan_iter(match=f"{_SANDBOXES}*", count=1000))
    values = redis.mget(keys) if keys else []
    return {k.removeprefix(_SANDBOXES): int(v) for k, v in zip(keys, values, strict=True) if v is not None}


def _text(value: bytes | str) -> str:
    return value.decode() if isinstance(value, bytes) else value


class Exposition:
    """Prometheus text format (0.0.4): one ``# HELP``/``# TYPE`` per family, then its samples."""

    def __init__(self) -> None:
        self._lines: list[str] = []

    def family(self, name: str, kind: str, help_text: str) -> Exposition:
        self._lines += [f"# HELP {name} {help_text}", f"# TYPE {name} {kind}"]
        return self

    def sample(self, name: str, value: float, labels: Mapping[str, str] | None = None) -> Exposition:
        self._lines.append(f"{name}{_labels(labels or {})} {_number(value)}")
        return self

    def histogram(
        self, name: str, bounds: Iterable[float], counts: Iterable[int], total: float, labels: Mapping[str, str]
    ) -> None:
        running = 0
        counts = list(counts)
        for bound, count in zip([*bounds, float("inf")], counts, strict=True):
            running += count
            le = "+Inf" if bound == float("inf") else _number(bound)
            self.sample(f"{name}_bucket", running, {**labels, "le": le})
        self.sample(f"{name}_sum", total, labels)
        self.sample(f"{name}_count", running, labels)

    def text(self) -> str:
        return "\n".join(self._lines) + "\n"


def _labels(labels: Mapping[str, str]) -> str:
    if not labels:
        return ""
    escaped = (f'{k}="{_escape(str(v))}"' for k, v in labels.items())
    return "{" + ",".join(escaped) + "}"


def _escape(value: str) -> str:
    return value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


def _number(value: float) -> str:
    if isinstance(value, int) or float(value).is_integer():
        return str(int(value))
    return repr(float(value))
