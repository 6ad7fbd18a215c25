"""The parts every HTTP app of the platform installs, and the platform it serves."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Annotated, Any

from fastapi import Depends, FastAPI, Request
from fastapi.routing import APIRoute

from service.http.limits import BodySizeLimit
from service.http.problems import install_problem_handlers
from service.platform import Platform


def operation_id(route: APIRoute) -> str:
    """Stable operation ids (the function names) for generated clients."""
    return route.name


async def get_platform(request: Request) -> Platform:
    platform: Platform = request.app.state.platform
    return platform


PlatformDep = Annotated[Platform, Depends(get_platform)]


def install_common(app: FastAPI, platform: Platform, *, fast_paths: Sequence[Any] = ()) -> None:
    """What every app of the platform has: its platform, the body size limit, the problem+json
    error handlers, and `fast_paths`: middleware that answers some requests ahead of routing,
    inside the body size limit."""
    app.state.platform = platform
    for middleware in fast_paths:
        app.add_middleware(middleware)
    app.add_middleware(BodySizeLimit, max_bytes=platform.settings.max_upload_bytes)
    install_problem_handlers(app)
