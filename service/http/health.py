"""Liveness and readiness."""

from __future__ import annotations

from fastapi import APIRouter
from sqlalchemy.exc import SQLAlchemyError

from service.db import repository
from service.errors import DlaasError
from service.http.app import PlatformDep

router = APIRouter(tags=["health"])

# Probes ask without a key.
PUBLIC_PATHS = ("/healthz", "/readyz")


class NotReady(DlaasError):
    status = 503
    title = "Service unavailable"
    slug = "not-ready"


@router.get("/healthz")
def healthz() -> dict[str, str]:
    return {"status": "ok"}


@router.get("/readyz", responses={503: {"description": "The database is not reachable"}})
def readyz(platform: PlatformDep) -> dict[str, str]:
    try:
        with platform.engine.connect() as conn:
            repository.ping(conn)
    except SQLAlchemyError as e:
        raise NotReady(f"the database is not reachable: {type(e).__name__}") from e
    return {"status": "ready", "database": "ok"}
