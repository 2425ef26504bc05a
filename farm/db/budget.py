"""The connection budget: how many PostgreSQL connections each kind of farm process may open, sized
from what it runs, and what a deployment opens in all (docs/operations.md, "Database connections").

A worker's stages hold a connection only while their statements run (a claim, a completion: a few
milliseconds of a stage that lasts seconds to hours), so its pools grow with its slots slowly: one
connection per ``worker_slots_per_connection`` slots. A checkout that finds its pool busy waits for
a connection rather than opening one more; a worker that cannot get one at all waits and tries again
(``farm.db.session.unavailable``), so a full or restarting database costs time, never an attempt.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from farm.config import DatabaseSettings, Settings
from farm.constants import Stage


@dataclass(frozen=True)
class ProcessPools:
    """One process's pools: each by name with the most connections it may hold."""

    kind: str
    pools: tuple[tuple[str, int], ...]

    @property
    def total(self) -> int:
        return sum(size for _, size in self.pools)

    def describe(self) -> str:
        return f"{self.kind}: at most {self.total} ({', '.join(f'{name} {size}' for name, size in self.pools)})"


def worker_claim_connections(database: DatabaseSettings, slots: int) -> int:
    """A worker process's pool for its one-statement claims and completions."""
    return max(1, math.ceil(slots / database.worker_slots_per_connection))


def worker_pools(settings: Settings, slots: int) -> ProcessPools:
    """A worker process with ``slots`` slots: ``claims`` for its claims and the completions that do not
    wait for the disk; ``main`` for its transactions, the completions that finish a job, and its
    upkeep (lease renewals, sweeps: one more connection)."""
    claims = worker_claim_connections(settings.database, slots)
    return ProcessPools("worker", (("main", claims + 1), ("claims", claims)))


def proxy_pools(settings: Settings) -> ProcessPools:
    """The proxy's routes (``farm.proxy.app.make_core``): an engine for its reads and pending rows
    (``proxy_pool_size`` kept, as many more for a burst) and two async pools for the recorder, each
    up to twice ``proxy_pool_size``. They open when a harness first calls."""
    size = settings.database.proxy_pool_size
    return ProcessPools("proxy routes", (("reads", 2 * size), ("recorder", 4 * size)))


def proxy_settings(settings: Settings) -> Settings:
    """``settings`` as the proxy's routes size their pools from (``database.pool_size``)."""
    size = settings.database.proxy_pool_size
    database = settings.database.model_copy(update={"pool_size": size, "max_overflow": size})
    return settings.model_copy(update={"database": database})


def api_pools(settings: Settings) -> ProcessPools:
    """An API process: its engine, and the proxy routes it serves too."""
    db = settings.database
    proxy = proxy_pools(settings)
    return ProcessPools("api", (("main", db.pool_size + db.max_overflow), *proxy.pools))


def proxy_process_pools(settings: Settings) -> ProcessPools:
    """A ``farm proxy`` serving process: the proxy's routes and the engine that records finishes."""
    size = settings.database.proxy_pool_size
    return ProcessPools("proxy", (("finishes", 2 * size), *proxy_pools(settings).pools))


@dataclass(frozen=True)
class Deployment:
    """What ``nodes`` nodes, each with one worker process per stage, and their API processes open."""

    nodes: int
    per_node: int
    api: int
    proxies: int

    @property
    def total(self) -> int:
        return self.nodes * self.per_node + self.api + self.proxies


def node_worker_slots(settings: Settings) -> Sequence[int]:
    """The slots of a node's worker processes: one per stage (``farm worker -Q init``, ``-Q run``, ``-Q eval``)."""
    w = settings.worker
    return [
        {Stage.INIT: w.init_concurrency, Stage.RUN: w.run_concurrency, Stage.EVAL: w.eval_concurrency}[s] for s in Stage
    ]


def deployment(settings: Settings, nodes: int, *, api_processes: int = 1, proxy_processes: int = 0) -> Deployment:
    per_node = sum(worker_pools(settings, slots).total for slots in node_worker_slots(settings))
    return Deployment(
        nodes=nodes,
        per_node=per_node,
        api=api_processes * api_pools(settings).total,
        proxies=proxy_processes * proxy_process_pools(settings).total,
    )
