"""The FastAPI application."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from fastapi import FastAPI

from service.api import deployments, logs, results, tenants, trainings, usage
from service.api.deps import LoopReads
from service.http import health
from service.http.app import install_common, operation_id
from service.memory import settled
from service.platform import Platform
from service.scoring import predictions
from service.settings import Settings


def create_app(settings: Settings | None = None, platform: Platform | None = None) -> FastAPI:
    """The API app. Pass a Platform to share one with a worker in the same process."""
    platform = platform or Platform.from_settings(settings or Settings())

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        if platform.settings.auto_migrate:
            platform.migrate()
        app.state.reads = LoopReads(platform.engine)
        try:
            async with predictions.serving(app, platform):
                with settled():
                    yield
        finally:
            await app.state.reads.aclose()

    app = FastAPI(
        title="DLaaS",
        version="0.1.0",
        summary="Distributed deep-learning training as a service.",
        lifespan=lifespan,
        generate_unique_id_function=operation_id,
    )
    app.state.log_followers = logs.LogFollowers(platform.settings.max_log_followers_per_tenant)
    install_common(
        app,
        platform,
        fast_paths=[predictions.FastPredictions],
        public_paths=health.PUBLIC_PATHS,
    )
    # Routes are matched in order: the hot paths first (predictions, then trainings).
    app.include_router(predictions.predictions_router(platform))
    app.include_router(trainings.router)
    app.include_router(health.router)
    app.include_router(tenants.router)
    app.include_router(logs.router)
    app.include_router(results.router)
    app.include_router(deployments.router)
    app.include_router(usage.router)
    return app
