"""Celery's Redis transport, with one client object per channel instead of one per command.

kombu's Redis channel makes a new ``redis.Redis`` for every message it publishes, every message
it delivers (the unacked bookkeeping) and every ack. A client is a thin, thread-safe front of
the channel's connection pool, but redis-py 8 fills a table of ~170 response callbacks each
time one is made: ~66 us, three times per stage, a sixth of what sending a stage costs. This
channel makes the synchronous client once per connection pool. Selected by the Celery app's
``broker_transport`` (``farm.worker.app``); the broker URL stays a plain ``redis://`` URL.
"""

from __future__ import annotations

from typing import Any

from kombu.transport import redis as kombu_redis


class Channel(kombu_redis.Channel):
    _sync_client: Any = None

    def _create_client(self, asynchronous: bool = False) -> Any:
        if asynchronous:
            return super()._create_client(asynchronous=True)  # type: ignore[no-untyped-call]
        client = self._sync_client
        # A channel that lost its connection makes a new pool: the client follows it.
        if client is None or client.connection_pool is not self.pool:
            client = self._sync_client = super()._create_client()  # type: ignore[no-untyped-call]
        return client


class Transport(kombu_redis.Transport):
    Channel = Channel
