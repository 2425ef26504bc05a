"""The Celery app factory and the per-process runtime (engine, sessions, Redis) it carries."""

from __future__ import annotations

import threading
from typing import TYPE_CHECKING, Any

from celery import Celery
from redis import Redis
from sqlalchemy import Engine
from sqlalchemy.orm import Session, sessionmaker

from farm.config import Settings
from farm.db.budget import ProcessPools, worker_pools
from farm.db.sampling import SamplingCache
from farm.db.session import autocommit_of, make_autocommit_engine, make_engine, make_session_factory
from farm.worker.aio import LoopThread
from farm.worker.lease import LeaseRenewer
from farm.worker.staleness import StalenessCheck

if TYPE_CHECKING:
    from farm.trials.resources import TrialResources
    from farm.worker.llm import LLMResources
    from farm.worker.sandboxes import SandboxResources


class FarmRuntime:
    """Connections one process needs, opened lazily so they are created after a prefork fork."""

    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self._lock = threading.Lock()
        self._engine: Engine | None = None
        # durable -> the autocommit engine (None on SQLite), made on first use
        self._autocommit: dict[bool, Engine | None] = {}
        self._sessions: sessionmaker[Session] | None = None
        self._redis: Redis | None = None
        #: sampling parameters of the batches this process has claimed jobs of.
        self.samplings = SamplingCache()
        self.leases = LeaseRenewer(settings, engine=lambda: self.engine, redis_client=lambda: self.redis)
        # Each running episode blocks at most one pool thread at a time (a tool call, a balancer call);
        # INIT and EVAL stages run their blocking work (a sandbox start, a grader) there too.
        w = settings.worker
        self.aio = LoopThread(max_threads=max(32, 2 * w.run_concurrency + w.init_concurrency + w.eval_concurrency))
        self._llm: LLMResources | None = None
        self._sandboxes: SandboxResources | None = None
        self._trials: TrialResources | None = None
        #: this process's pools, sized from its slots (``farm.db.budget``); ``size_pools`` sets them
        #: for a worker process before its first connection. Until then: a process serving every stage.
        self.pools = worker_pools(settings, w.init_concurrency + w.run_concurrency + w.eval_concurrency)
        self._name = "farm-worker"
        self.staleness = StalenessCheck(engine=lambda: self.engine, balancer=lambda: self.llm.balancer)

    def size_pools(self, slots: int, *, name: str) -> ProcessPools:
        """Size this process's pools for ``slots`` slots; ``name`` shows in ``pg_stat_activity``."""
        with self._lock:
            assert self._engine is None and not self._autocommit, "pools are sized before they open"
            self.pools = worker_pools(self.settings, slots)
            self._name = name
            return self.pools

    def _size(self, pool: str) -> int:
        return dict(self.pools.pools)[pool]

    @property
    def engine(self) -> Engine:
        with self._lock:
            return self._engine_unlocked()

    def _engine_unlocked(self) -> Engine:
        if self._engine is None:
            self._engine = make_engine(self.settings, size=self._size("main"), overflow=0, name=self._name)
            self._sessions = make_session_factory(self._engine)
        return self._engine

    def autocommit(self, *, durable: bool = False) -> Engine | None:
        """The engine for one-statement claims and completions; ``durable`` for those that
        finish a job (None on SQLite; see ``make_autocommit_engine``). The durable one shares the
        main engine's pool: completions that finish a job are few next to claims."""
        with self._lock:
            if durable not in self._autocommit:
                if durable:
                    self._autocommit[durable] = autocommit_of(self._engine_unlocked())
                else:
                    self._autocommit[durable] = make_autocommit_engine(
                        self.settings, durable=False, size=self._size("claims"), overflow=0, name=self._name
                    )
            return self._autocommit[durable]

    @property
    def sessions(self) -> sessionmaker[Session]:
        _ = self.engine
        assert self._sessions is not None
        return self._sessions

    @property
    def redis(self) -> Redis:
        with self._lock:
            return self._redis_unlocked()

    @property
    def llm(self) -> LLMResources:
        with self._lock:
            if self._llm is None:
                from farm.worker.llm import LLMResources

                self._llm = LLMResources(self.settings, redis_client=self._redis_unlocked())
            return self._llm

    @property
    def sandboxes(self) -> SandboxResources:
        with self._lock:
            if self._sandboxes is None:
                from farm.worker.sandboxes import SandboxResources

                self._sandboxes = SandboxResources(self.settings)
            return self._sandboxes

    @property
    def trials(self) -> TrialResources:
        sessions, balancer = self.sessions, self.llm.balancer  # each takes the lock itself
        with self._lock:
            if self._trials is None:
                from farm.trials.resources import TrialResources

                self._trials = TrialResources(self.settings, sessions=sessions, balancer=balancer)
            return self._trials

    def _redis_unlocked(self) -> Redis:
        if self._redis is None:
            self._redis = Redis.from_url(self.settings.redis_url)
        return self._redis

    def close(self) -> None:
        with self._lock:
            if self._engine is not None:
                self._engine.dispose()
                self._engine = self._sessions = None
            for durable, engine in self._autocommit.items():
                if engine is not None and not durable:  # the durable one is the main engine's pool
                    engine.dispose()
            self._autocommit.clear()
            if self._redis is not None:
                self._redis.close()
                self._redis = None
        self.aio.close()


#: kombu's Redis transport with one client per channel (see ``farm.worker.transport``).
REDIS_TRANSPORT = "farm.worker.transport:Transport"


class FarmCelery(Celery):  # type: ignore[misc]
    """A Celery app that carries farm's runtime, so tasks reach settings and connections
    through ``self.app.farm`` instead of globals."""

    farm: FarmRuntime


def make_celery_app(settings: Settings, **overrides: Any) -> FarmCelery:
    """The app every farm process uses. Stage tasks are registered separately
    (``farm.worker.stages.register_stages``) so the API can send by name without importing them."""
    app = FarmCelery("farm", broker=settings.redis_url, set_as_current=False)
    app.conf.update(
        broker_transport=REDIS_TRANSPORT,
        task_serializer="json",
        accept_content=["json"],
        task_ignore_result=True,
        # A stage's message is acknowledged only after the stage recorded its result; a worker
        # that dies mid-stage leaves the message to be re-delivered (and the lease sweeper re-sends
        # it sooner). Prefetch 1 keeps one worker from hoarding long stages.
        task_acks_late=True,
        task_reject_on_worker_lost=True,
        worker_prefetch_multiplier=settings.worker.prefetch_multiplier,
        broker_connection_retry_on_startup=True,
        broker_transport_options={"visibility_timeout": settings.celery.visibility_timeout_s},
        worker_hijack_root_logger=False,
        # Task events cost two or three extra Redis publishes per stage; Flower switches them
        # on in the workers when it starts (its enable_events default), so they are off here.
        worker_send_task_events=False,
        task_send_sent_event=False,
        task_default_queue="init",
    )
    app.conf.update(overrides)
    app.farm = FarmRuntime(settings)
    return app
