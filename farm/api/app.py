"""``create_app(settings)``: the FastAPI facade."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import redis
from celery import Celery
from fastapi import Depends, FastAPI
from fastapi.responses import JSONResponse

from farm import __version__
from farm.api.deps import AppState, require_token, single_valued_query
from farm.api.docs import install_docs
from farm.api.errors import BodyLimitMiddleware, error_responses, install_error_handlers
from farm.api.events import FinishNotifier
from farm.api.openapi import install_openapi
from farm.api.routes import (
    backends,
    batches,
    health,
    jobs,
    overview,
    pass_rates,
    tasks,
    trials,
    verl_sessions,
    weights,
)
from farm.config import Settings
from farm.db import backends as registry
from farm.db.budget import proxy_settings
from farm.db.session import make_engine, make_session_factory, transaction
from farm.errors import ConfigError
from farm.handlers.registry import allow_handler_paths
from farm.llm.balancer import Balancer
from farm.llm.health import HealthChecker
from farm.proxy.app import make_core
from farm.proxy.openapi import API_PATH as proxy_openapi_path
from farm.proxy.openapi import proxy_openapi
from farm.proxy.routes import make_router
from farm.weights.coordinator import WeightUpdater
from farm.worker.app import make_celery_app


def _registered(state: AppState) -> list[dict[str, Any]]:
    with transaction(state.sessions) as session:
        return registry.registered(session)


def create_app(settings: Settings, *, celery_app: Celery | None = None) -> FastAPI:
    """Build the API. Raises ConfigError when no API token is configured."""
    if settings.api.token is None or not settings.api.token.get_secret_value():
        raise ConfigError("no API token: set FARM_API__TOKEN (every route but the health checks needs it)")
    allow_handler_paths(settings.handler_paths)
    engine = make_engine(settings, name="farm-api")
    redis_client = redis.Redis.from_url(settings.redis_url)
    balancer = Balancer.from_settings(redis_client, settings.llm)
    state = AppState(
        settings=settings,
        engine=engine,
        sessions=make_session_factory(engine),
        redis=redis_client,
        celery=celery_app or make_celery_app(settings),
        notifier=FinishNotifier(settings.redis_url),
        balancer=balancer,
    )
    # Probes every backend's /health, ejecting dead ones and re-admitting them when they answer.
    # Also puts back, from the database, backends Redis lost.
    checker = HealthChecker.from_settings(balancer, settings.llm, registered=lambda: _registered(state))
    updater = WeightUpdater(sessions=state.sessions, balancer=balancer, settings=settings.llm)

    @asynccontextmanager
    async def lifespan(_: FastAPI) -> AsyncIterator[None]:
        await state.notifier.start()
        checker.start()
        # Finishes a weight update a dead API process left owed, rolls back an abandoned one.
        updater.start()
        try:
            yield
        finally:
            await app.state.proxy_core.stop()
            updater.stop()
            checker.stop()
            await state.notifier.stop()
            state.redis.close()
            engine.dispose()

    app = FastAPI(
        title="rollout-farm",
        version=__version__,
        description="Rollout-as-a-service: submit agent tasks, stream back token-exact trajectories.",
        lifespan=lifespan,
        docs_url=None,
        redoc_url=None,
        dependencies=[Depends(single_valued_query)],
    )
    app.state.farm = state
    # The proxy's routes size their pools apart from the API's own (``farm.db.budget``).
    app.state.proxy_core = make_core(proxy_settings(settings), engine=engine, balancer=balancer)
    app.state.farm_checker = checker
    app.state.weights = updater
    install_error_handlers(app)
    install_openapi(app, settings)
    install_docs(app)
    app.add_middleware(
        BodyLimitMiddleware, max_bytes=settings.api.max_body_bytes, read_timeout_s=settings.api.read_timeout_s
    )
    app.include_router(health.router)
    protected = [Depends(require_token)]
    # Every route of these routers needs the token and reaches the database or Redis.
    answers = error_responses(401, 503)
    app.include_router(batches.router, dependencies=protected, responses=answers)
    app.include_router(jobs.router, dependencies=protected, responses=answers)
    app.include_router(backends.router, dependencies=protected, responses=answers)
    app.include_router(overview.router, dependencies=protected, responses=answers)
    app.include_router(tasks.router, dependencies=protected, responses=answers)
    app.include_router(pass_rates.router, dependencies=protected, responses=answers)
    app.include_router(trials.router, dependencies=protected, responses=answers)
    app.include_router(weights.router, dependencies=protected, responses=answers)
    # verl's session calls take the token as Basic auth too (a proxy URL with userinfo).
    app.include_router(verl_sessions.router, responses=answers)
    # The proxy's routes take a trial's key, not the farm's token; verl's harnesses use /{trial}/v1.
    # Their own OpenAPI document (farm.proxy.openapi), public as the API's is.
    app.add_api_route(proxy_openapi_path, lambda: JSONResponse(proxy_openapi()), include_in_schema=False)
    app.include_router(make_router(lambda request: request.app.state.proxy_core))
    app.include_router(make_router(lambda request: request.app.state.proxy_core, prefix="/{trial}/v1"))
    return app
