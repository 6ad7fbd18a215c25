"""The parts every HTTP app of the platform installs, and the platform it serves."""

from __future__ import annotations

from collections.abc import Collection, Sequence
from typing import Annotated, Any

from fastapi import Depends, FastAPI, Request
from fastapi.routing import APIRoute

from service.http.limits import BodyCap, BodyLimits, RequestGate
from service.http.problems import document_problems, install_problem_handlers
from service.http.rates import RequestRates, open_buckets
from service.platform import Platform


def operation_id(route: APIRoute) -> str:
    """Stable operation ids (the function names) for generated clients."""
    return route.name


async def get_platform(request: Request) -> Platform:
    platform: Platform = request.app.state.platform
    return platform


PlatformDep = Annotated[Platform, Depends(get_platform)]


def body_limits(platform: Platform) -> BodyLimits:
    """Each route's body cap, from the settings."""
    settings = platform.settings
    return BodyLimits(
        json=BodyCap(settings.max_json_bytes, "DLAAS_MAX_JSON_BYTES"),
        upload=BodyCap(settings.max_upload_bytes, "DLAAS_MAX_UPLOAD_BYTES"),
        predictions=BodyCap(settings.max_prediction_bytes, "DLAAS_MAX_PREDICTION_BYTES"),
    )


def request_rates(platform: Platform) -> RequestRates:
    """The request rates of service.http.rates: in Redis where the platform has it, else
    in this process."""
    settings = platform.settings
    return RequestRates(
        open_buckets(settings.resolved_rate_limit_url),
        settings.auth_failures_per_minute,
        pause=settings.rate_limit_pause_seconds,
    )


def install_common(
    app: FastAPI,
    platform: Platform,
    *,
    fast_paths: Sequence[Any] = (),
    public_paths: Collection[str] = (),
    public_prefixes: Collection[str] = (),
    forwarded_predictions: bool = False,
) -> None:
    """What every app of the platform has: its platform, the request gate (the caller's
    key, then each route's body cap, before a body is read), the problem+json error
    handlers, and `fast_paths`: middleware that answers some requests ahead of routing,
    inside the gate. `public_paths` (and the app's docs), and every path under
    `public_prefixes`, need no key. With `forwarded_predictions` (the app forwards them
    to the scoring service, whose own gate counts them) predictions are not counted
    against the tenant's request rate here."""
    app.state.platform = platform
    app.state.request_rates = rates = request_rates(platform)
    for middleware in fast_paths:
        app.add_middleware(middleware)
    docs = (app.openapi_url, app.docs_url, app.redoc_url, app.swagger_ui_oauth2_redirect_url)
    public = {*public_paths, *(path for path in docs if path)}
    app.add_middleware(
        RequestGate,
        platform=platform,
        limits=body_limits(platform),
        rates=rates,
        public_paths=public,
        public_prefixes=public_prefixes,
        forwarded_predictions=forwarded_predictions,
    )
    install_problem_handlers(app)
    generate = app.openapi

    def openapi() -> dict[str, Any]:
        # FastAPI caches the document on the app; it is completed once, on first use.
        if app.openapi_schema is None:
            app.openapi_schema = document_problems(generate(), public_paths=public)
        return app.openapi_schema

    app.openapi = openapi  # type: ignore[method-assign]
