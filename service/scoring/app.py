"""The scoring service on its own: the predictions route, TensorFlow Serving's REST paths
(`tfs_rest`) and health, nothing else.

Run it with `python -m service.scoring` where it should scale apart from the API (its own
Kubernetes Deployment), and point the API at it with DLAAS_SCORING_URL; it reads the same
DLAAS_* settings (database, object store, rate-limit Redis) as the API.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from fastapi import FastAPI

from service.http import health
from service.http.app import install_common, operation_id
from service.http.server import NO_FRAMEWORK_TELEMETRY
from service.memory import settled
from service.platform import Platform
from service.scoring import predictions, tfs_rest
from service.settings import Settings


def create_scoring_app(
    settings: Settings | None = None, platform: Platform | None = None
) -> FastAPI:
    platform = platform or Platform.from_settings(settings or Settings())

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        if platform.settings.auto_migrate:
            platform.migrate()
        async with predictions.serving(app, platform, local=True):
            with settled():
                yield

    app = FastAPI(
        title="DLaaS scoring",
        version="0.1.0",
        summary="Predictions of deployed TensorFlow models.",
        lifespan=lifespan,
        generate_unique_id_function=operation_id,
        telemetry=NO_FRAMEWORK_TELEMETRY,
    )
    install_common(
        app,
        platform,
        fast_paths=[predictions.FastPredictions, tfs_rest.FastServing],
        public_paths=health.PUBLIC_PATHS,
    )
    app.include_router(health.router)
    app.include_router(predictions.predictions_router(platform, local=True))
    app.include_router(tfs_rest.tfs_router(platform, local=True))
    return app
