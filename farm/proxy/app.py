"""``farm proxy``: the proxy's routes in a process of their own, to scale out apart from the API.

Any number of these serve any trial: a trial's state is in PostgreSQL and Redis. Besides its TCP
port, a proxy may listen on a Unix socket (``proxy.socket``), which sandboxes without a network
reach through a bind mount.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import asynccontextmanager

import redis
from sqlalchemy import Engine
from starlette.applications import Starlette
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from farm.config import Settings
from farm.db.session import make_autocommit_engine, make_engine
from farm.llm.balancer import Balancer
from farm.llm.session import ClientPool
from farm.llm.tokenizer import load_tokenizer
from farm.proxy.core import ProxyCore
from farm.proxy.errors import any_sdk_error_body
from farm.proxy.openapi import proxy_openapi
from farm.proxy.routes import proxy_routes
from farm.trials.recorder import make_recorder

#: threads for the database, the template and the balancer (asyncio's default pool has cpu + 4: calls would queue).
WORK_THREADS = 64


def make_core(settings: Settings, *, engine: Engine, balancer: Balancer) -> ProxyCore:
    """A process's ``ProxyCore``: ``engine`` records the calls' finishes (durably); the reads and
    pending rows go through an engine of their own that does not wait for the disk."""
    executor = ThreadPoolExecutor(max_workers=WORK_THREADS, thread_name_prefix="proxy")
    recorder = make_recorder(
        durable=engine,
        early=make_autocommit_engine(settings, durable=False),
        executor=executor,
        url=settings.database_url,
        # As many connections as the engines may open (their pool and its overflow).
        pool_size=2 * settings.database.pool_size,
        prepared_statements=settings.database.prepared_statements,
        startup_options=settings.database.startup_options,
    )
    return ProxyCore(
        settings=settings.proxy,
        recorder=recorder,
        executor=executor,
        balancer=balancer,
        clients=ClientPool.from_settings(settings.llm),
        tokenizer=lambda: load_tokenizer(settings),
        served_model=settings.llm.builtin_model_name,
    )


def create_proxy_app(settings: Settings) -> Starlette:
    engine = make_engine(settings)
    redis_client = redis.Redis.from_url(settings.redis_url)
    core = make_core(settings, engine=engine, balancer=Balancer.from_settings(redis_client, settings.llm))

    @asynccontextmanager
    async def lifespan(_: Starlette) -> AsyncIterator[None]:
        await core.warm()
        try:
            yield
        finally:
            await core.stop()
            redis_client.close()
            engine.dispose()

    async def http_error(request: Request, exc: Exception) -> Response:
        # A harness's SDK reads its own error shape (an unknown route, a method a route does not take).
        assert isinstance(exc, StarletteHTTPException)
        message = f"{request.method} {request.url.path}: {exc.detail}"
        body = any_sdk_error_body(exc.status_code, message, str(exc.detail).lower().replace(" ", "_"))
        return JSONResponse(body, status_code=exc.status_code, headers=dict(exc.headers or {}))

    async def health(_: Request) -> Response:
        return Response(status_code=200)

    async def openapi(_: Request) -> Response:
        return JSONResponse(proxy_openapi())

    # Starlette, not FastAPI: the routes are plain (``proxy_routes``), and FastAPI's middleware
    # would only add CPU to every call.
    app = Starlette(
        routes=[
            Route("/health", health),
            Route("/openapi.json", openapi),
            *proxy_routes(lambda request: request.app.state.proxy_core),
        ],
        exception_handlers={StarletteHTTPException: http_error},
        lifespan=lifespan,
    )
    app.state.proxy_core = core
    return app
