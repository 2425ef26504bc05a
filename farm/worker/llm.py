"""What a stage gets to talk to LLMs: the balancer, pooled clients, the policy's tokenizer.

Handed to handlers as ``ctx.llm`` (the ``LLM`` protocol of ``farm.handlers.base``). Everything is
created on first use, so a worker whose handlers never call a model never imports transformers
or touches the balancer.
"""

from __future__ import annotations

import threading
from typing import Any

import redis

from farm.config import Settings
from farm.llm.balancer import Balancer
from farm.llm.session import ClientPool, LLMSession
from farm.llm.tokenizer import load_tokenizer
from farm.proxy.parsers import ParserNames, choose


class LLMResources:
    def __init__(self, settings: Settings, *, redis_client: redis.Redis) -> None:
        self._settings = settings
        self.balancer = Balancer.from_settings(redis_client, settings.llm)
        self._clients: ClientPool | None = None
        self._tokenizer: Any = None
        self._parsers: ParserNames | None = None
        self._lock = threading.Lock()

    def session(self, job_id: int) -> LLMSession:
        """The job's sticky link to a backend. Call from a coroutine on the worker's event loop."""
        if self._clients is None:
            self._clients = ClientPool.from_settings(self._settings.llm)
        return LLMSession(
            balancer=self.balancer,
            job_id=str(job_id),
            clients=self._clients,
            backend_wait_s=self._settings.llm.backend_wait_s,
            count_tokens=True,
        )

    @property
    def tokenizer(self) -> Any:
        with self._lock:
            if self._tokenizer is None:
                self._tokenizer = load_tokenizer(self._settings)
            return self._tokenizer

    @property
    def parsers(self) -> ParserNames:
        """The parsers the proxy would read the policy's answers with (its settings, else the family
        whose template the tokenizer carries)."""
        if self._parsers is None:
            self._parsers = choose(self._settings.proxy, getattr(self.tokenizer, "chat_template", None))
        return self._parsers

    def release(self, job_id: int) -> None:
        """Give the job's backend slot back (idempotent; for teardown after failures)."""
        self.balancer.release(str(job_id))
