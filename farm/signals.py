"""The figures an RL run is watched by: reward, tokens, episode length, proxy latency.

A worker adds an episode's figures when its RUN or EVAL is recorded, a job's LLM session adds the
tokens each backend sampled when it closes, and a proxy process adds up its calls for a second
before sending them: each a ``Tally`` sent to Redis in one pipelined round trip. ``/metrics``
reads them back (``read``), and ``farm status`` reads the recent tokens per backend and the tokens
per batch. As with ``farm.metrics``, Redis may lose them: a counter that starts again at zero is a
reset, which Prometheus's ``rate()`` expects.
"""

from __future__ import annotations

import json
import logging
import time
from bisect import bisect_left
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

from redis import Redis

from farm.metrics import read_indexed_hashes
from farm.schemas.stages import EvalResult, RunResult

log = logging.getLogger(__name__)

#: reward buckets: most graders pay 0 or 1, some part marks.
REWARD_BUCKETS: tuple[float, ...] = (0.0, 0.1, 0.25, 0.5, 0.75, 0.9, 1.0)
#: model turns in an episode.
TURN_BUCKETS: tuple[float, ...] = (1, 2, 3, 5, 10, 20, 50, 100, 200)
#: an episode's length in tokens (prompt, observations and sampled ids).
LENGTH_BUCKETS: tuple[float, ...] = (256, 512, 1024, 2048, 4096, 8192, 16384, 32768, 65536, 131072)
#: seconds a proxy call took from its arrival to its last byte.
PROXY_CALL_BUCKETS: tuple[float, ...] = (0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0)

#: what ``farm status`` calls a backend's recent tokens/s: the sampled tokens of the last minute.
RECENT_WINDOW_S = 60
#: the time slices the recent tokens are counted in (one key each, expiring after the window).
_SLICE_S = 10
#: a batch's token counts outlive its last job by this much (``farm status BATCH`` after the fact).
BATCH_TTL_S = 7 * 24 * 3600

_PREFIX = "farm:metrics:"
_HIST = _PREFIX + "hist:"  # + family + "|" + labels (JSON): bucket counts, count and sum
_HIST_INDEX = _PREFIX + "hist-keys"
_COUNTER = _PREFIX + "counter:"  # + family: labels (JSON) -> value
_RECENT = _PREFIX + "recent:"  # + backend + ":" + slice: sampled tokens in that slice
_BATCH = _PREFIX + "batch:"  # + batch id: sampled, prompt tokens

#: the histograms and their buckets, by family name.
HISTOGRAMS: dict[str, tuple[float, ...]] = {
    "farm_reward": REWARD_BUCKETS,
    "farm_episode_turns": TURN_BUCKETS,
    "farm_episode_tokens": LENGTH_BUCKETS,
    "farm_proxy_call_seconds": PROXY_CALL_BUCKETS,
}


def _key(labels: Mapping[str, str]) -> str:
    return json.dumps(dict(sorted(labels.items())), separators=(",", ":"))


@dataclass
class Tally:
    """Figures added up in the process, then sent to Redis in one round trip (``send``)."""

    hists: dict[tuple[str, str], list[float]] = field(default_factory=dict)
    counts: dict[tuple[str, str], int] = field(default_factory=dict)
    recent: dict[tuple[str, int], int] = field(default_factory=dict)
    batches: dict[tuple[int, str], int] = field(default_factory=dict)

    def observe(self, family: str, value: float, **labels: str) -> None:
        bounds = HISTOGRAMS[family]
        slot = self.hists.setdefault((family, _key(labels)), [0.0] * (len(bounds) + 3))
        slot[bisect_left(bounds, value)] += 1  # index len(bounds) is +Inf
        slot[-2] += 1
        slot[-1] += value

    def count(self, family: str, amount: int, **labels: str) -> None:
        if amount:
            key = (family, _key(labels))
            self.counts[key] = self.counts.get(key, 0) + amount

    def backend_tokens(self, backend: str, *, prompt: int, sampled: int, now: float | None = None) -> None:
        """One call to ``backend`` read ``prompt`` tokens and sampled ``sampled``."""
        self.count("farm_backend_prompt_tokens_total", prompt, backend=backend)
        self.count("farm_backend_sampled_tokens_total", sampled, backend=backend)
        at = int((time.time() if now is None else now) // _SLICE_S)
        self.recent[backend, at] = self.recent.get((backend, at), 0) + sampled

    def episode(self, task_type: str, batch_id: int, *, turns: int, length: int, sampled: int, prompt: int) -> None:
        """A RUN recorded its episode: ``sampled`` model tokens (loss mask 1) of ``length``."""
        self.observe("farm_episode_turns", turns, type=task_type)
        self.observe("farm_episode_tokens", length, type=task_type)
        self.count("farm_sampled_tokens_total", sampled, type=task_type)
        self.count("farm_prompt_tokens_total", prompt, type=task_type)
        for name, amount in (("sampled", sampled), ("prompt", prompt)):
            self.batches[batch_id, name] = self.batches.get((batch_id, name), 0) + amount

    def merge(self, other: Tally) -> None:
        """Add ``other``'s figures to these."""
        for key, slot in other.hists.items():
            mine = self.hists.setdefault(key, [0.0] * len(slot))
            for i, n in enumerate(slot):
                mine[i] += n
        for key, n in other.counts.items():
            self.counts[key] = self.counts.get(key, 0) + n
        for slice_key, n in other.recent.items():
            self.recent[slice_key] = self.recent.get(slice_key, 0) + n
        for batch_key, n in other.batches.items():
            self.batches[batch_key] = self.batches.get(batch_key, 0) + n

    def empty(self) -> bool:
        return not (self.hists or self.counts or self.recent or self.batches)

    def send(self, redis: Redis) -> None:
        """Everything added so far goes to Redis (and is forgotten here); never raises."""
        if self.empty():
            return
        hists, counts, recent, batches = self.hists, self.counts, self.recent, self.batches
        self.hists, self.counts, self.recent, self.batches = {}, {}, {}, {}
        try:
            pipe = redis.pipeline(transaction=False)
            for (family, labels), slot in hists.items():
                key = f"{_HIST}{family}|{labels}"
                for i, n in enumerate(slot[:-2]):
                    if n:
                        pipe.hincrby(key, f"b{i}", int(n))
                pipe.hincrby(key, "count", int(slot[-2]))
                pipe.hincrbyfloat(key, "sum", slot[-1])
                pipe.sadd(_HIST_INDEX, key)
            for (family, labels), n in counts.items():
                pipe.hincrby(f"{_COUNTER}{family}", labels, n)
            for (backend, at), n in recent.items():
                pipe.incrby(f"{_RECENT}{backend}:{at}", n)
                pipe.expire(f"{_RECENT}{backend}:{at}", RECENT_WINDOW_S + 2 * _SLICE_S)
            for (batch_id, name), n in batches.items():
                pipe.hincrby(f"{_BATCH}{batch_id}", name, n)
                pipe.expire(f"{_BATCH}{batch_id}", BATCH_TTL_S)
            pipe.execute()
        except Exception as exc:  # noqa: BLE001 - a figure is never worth failing a stage or a call over
            log.debug("signals not recorded: %s", exc)


def episode_recorded(
    redis: Redis, task_type: str, batch_id: int, run: RunResult | None, scored: EvalResult | None
) -> None:
    """A job's RUN (its episode's turns, length and tokens) or EVAL (its reward) was recorded."""
    tally = Tally()
    if run is not None:
        segments = [run.trajectory, *run.trajectory.segments]
        sampled = sum(sum(s.loss_mask) for s in segments)
        length = sum(len(s.token_ids) for s in segments)
        turns = sum(model_turns(s.loss_mask) for s in segments)
        tally.episode(task_type, batch_id, turns=turns, length=length, sampled=sampled, prompt=length - sampled)
    if scored is not None:
        tally.observe("farm_reward", scored.reward, type=task_type)
    tally.send(redis)


def model_turns(loss_mask: list[int]) -> int:
    """The model's turns in a segment: its runs of sampled tokens (loss mask 1)."""
    return sum(1 for i, m in enumerate(loss_mask) if m == 1 and (i == 0 or loss_mask[i - 1] == 0))


@dataclass(frozen=True)
class Histogram:
    family: str
    labels: dict[str, str]
    buckets: tuple[int, ...]  # per bucket (not cumulative), the last one +Inf
    count: int
    sum: float


def read_histograms(redis: Redis) -> list[Histogram]:
    out = []
    for key, fields in read_indexed_hashes(redis, _HIST_INDEX):
        family, _, labels = key.removeprefix(_HIST).partition("|")
        if family not in HISTOGRAMS:
            continue
        buckets = tuple(int(fields.get(f"b{i}", 0)) for i in range(len(HISTOGRAMS[family]) + 1))
        out.append(Histogram(family, json.loads(labels), buckets, int(fields.get("count", 0)), float(fields["sum"])))
    return out


def read_counters(redis: Redis, families: Iterable[str]) -> dict[str, list[tuple[dict[str, str], int]]]:
    """Per family: (labels, value) of each series."""
    families = list(families)
    pipe = redis.pipeline(transaction=False)
    for family in families:
        pipe.hgetall(f"{_COUNTER}{family}")
    return {
        family: sorted(((json.loads(_text(k)), int(v)) for k, v in raw.items()), key=lambda s: _key(s[0]))
        for family, raw in zip(families, pipe.execute(), strict=True)
    }


def recent_tokens_per_s(redis: Redis, backends: Iterable[str], *, now: float | None = None) -> dict[str, float]:
    """Per backend: the tokens it sampled per second over the last ``RECENT_WINDOW_S`` (finished
    calls only: a long call counts when it ends)."""
    backends = list(backends)
    if not backends:
        return {}
    current = int((time.time() if now is None else now) // _SLICE_S)
    slices = range(current - RECENT_WINDOW_S // _SLICE_S + 1, current + 1)
    keys = [f"{_RECENT}{b}:{s}" for b in backends for s in slices]
    values = [int(v) if v is not None else 0 for v in redis.mget(keys)]
    per = len(slices)
    return {b: sum(values[i * per : (i + 1) * per]) / RECENT_WINDOW_S for i, b in enumerate(backends)}


def batch_tokens(redis: Redis, batch_id: int) -> dict[str, int]:
    """The batch's recorded episodes' ``sampled`` and ``prompt`` tokens (empty when unknown)."""
    return {_text(k): int(v) for k, v in redis.hgetall(f"{_BATCH}{batch_id}").items()}


def _text(value: bytes | str) -> str:
    return value.decode() if isinstance(value, bytes) else value
