"""The FastAPI application."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from fastapi import FastAPI

from service.api import (
    deployment_versions,
    deployments,
    logs,
    metrics,
    results,
    tenants,
    trainings,
    usage,
)
from service.api.deps import LoopReads
from service.api.training_views import TrainingViews
from service.http import health
from service.http.app import install_common, operation_id
from service.http.server import NO_FRAMEWORK_TELEMETRY
from service.memory import settled
from service.platform import Platform
from service.scoring import predictions, tfs_rest
from service.settings import Settings
from service.ui import pages as ui


def training_views_for(platform: Platform) -> TrainingViews | None:
    """On PostgreSQL, the kept training bodies, current within the monitor's interval
    (its listener started); none on SQLite, whose reads run on the
    loop at a fraction of the cost and whose writers notify no one."""
    if platform.engine.dialect.name != "postgresql":
        return None
    views = TrainingViews(bound=platform.settings.monitor_interval)
    views.watch(platform.sessions)
    views.listen(platform.engine.url)
    return views


def create_app(settings: Settings | None = None, platform: Platform | None = None) -> FastAPI:
    """The API app. Pass a Platform to share one with a worker in the same process."""
    platform = platform or Platform.from_settings(settings or Settings())

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        if platform.settings.auto_migrate:
            platform.migrate()
        app.state.reads = LoopReads(platform.engine)
        views = app.state.training_views = training_views_for(platform)
        try:
            async with predictions.serving(app, platform):
                with settled():
                    yield
        finally:
            if views is not None:
                views.unwatch(platform.sessions)
                views.close()
            await app.state.reads.aclose()

    app = FastAPI(
        title="DLaaS",
        version="0.1.0",
        summary="Distributed deep-learning training as a service.",
        lifespan=lifespan,
        generate_unique_id_function=operation_id,
        telemetry=NO_FRAMEWORK_TELEMETRY,
    )
    app.state.log_followers = logs.LogFollowers(platform.settings.max_log_followers_per_tenant)
    install_common(
        app,
        platform,
        fast_paths=[predictions.FastPredictions, tfs_rest.FastServing],
        public_paths=(*health.PUBLIC_PATHS, ui.PREFIX),
        # The dashboard's pages ask for a key themselves (its sign-in page needs none).
        public_prefixes=(f"{ui.PREFIX}/",),
        # With DLAAS_SCORING_URL predictions are forwarded, and counted, there.
        forwarded_predictions=bool(platform.settings.scoring_url),
    )
    # Routes are matched in order: the hot paths first (predictions, then trainings).
    app.include_router(predictions.predictions_router(platform))
    app.include_router(tfs_rest.tfs_router(platform))
    app.include_router(trainings.router)
    app.include_router(health.router)
    app.include_router(tenants.router)
    app.include_router(logs.router)
    app.include_router(metrics.router)
    app.include_router(results.router)
    app.include_router(deployments.router)
    app.include_router(deployment_versions.router)
    app.include_router(usage.router)
    ui.install(app)
    return app
