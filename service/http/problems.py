"""The one renderer of errors: RFC 9457 problem+json for everything the API refuses."""

from __future__ import annotations

import logging
from http import HTTPStatus
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

from service.errors import DlaasError, FieldError

log = logging.getLogger("dlaas.api")
PROBLEM_JSON = "application/problem+json"


def problem(
    status: int,
    title: str,
    detail: str,
    *,
    slug: str,
    instance: str | None = None,
    errors: list[FieldError] | None = None,
    headers: dict[str, str] | None = None,
) -> JSONResponse:
    body: dict[str, Any] = {
        "type": f"urn:dlaas:problem:{slug}",
        "title": title,
        "status": status,
        "detail": detail,
    }
    if instance:
        body["instance"] = instance
    if errors:
        body["errors"] = [e.as_dict() for e in errors]
    return JSONResponse(body, status_code=status, media_type=PROBLEM_JSON, headers=headers)


def dlaas_problem(exc: DlaasError, instance: str) -> JSONResponse:
    """What the API answers when it refuses a request with `exc`."""
    headers = dict(exc.headers)
    if exc.status == 401:
        headers["WWW-Authenticate"] = "Bearer"
    return problem(
        exc.status,
        exc.title,
        exc.detail,
        slug=exc.slug,
        instance=instance,
        errors=exc.errors,
        headers=headers or None,
    )


def _request_field(loc: tuple[Any, ...]) -> str:
    # ("body", "model_definition") -> "model_definition"; ("query", "limit") -> "limit"
    parts = [str(p) for p in loc[1:]] if loc and loc[0] in ("body", "query", "path") else loc
    return "/".join(str(p) for p in parts) or "request"


def install_problem_handlers(app: FastAPI) -> None:
    @app.exception_handler(DlaasError)
    async def _dlaas(request: Request, exc: DlaasError) -> JSONResponse:
        return dlaas_problem(exc, request.url.path)

    @app.exception_handler(RequestValidationError)
    async def _invalid(request: Request, exc: RequestValidationError) -> JSONResponse:
        errors = [
            FieldError(
                _request_field(tuple(err["loc"])),
                "is required" if err["type"] == "missing" else err["msg"],
            )
            for err in exc.errors()
        ]
        return problem(
            422,
            "Validation failed",
            "; ".join(f"{e.field}: {e.message}" for e in errors),
            slug="validation-failed",
            instance=request.url.path,
            errors=errors,
        )

    @app.exception_handler(StarletteHTTPException)
    async def _http(request: Request, exc: StarletteHTTPException) -> JSONResponse:
        title = HTTPStatus(exc.status_code).phrase
        return problem(
            exc.status_code,
            title,
            str(exc.detail),
            slug=title.lower().replace(" ", "-"),
            instance=request.url.path,
            headers=getattr(exc, "headers", None),
        )

    @app.exception_handler(Exception)
    async def _unexpected(request: Request, exc: Exception) -> JSONResponse:
        log.exception("unhandled error on %s %s", request.method, request.url.path)
        return problem(
            500,
            "Internal server error",
            "the server failed to handle this request; it has been logged",
            slug="internal",
            instance=request.url.path,
        )
