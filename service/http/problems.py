"""The one renderer of errors: RFC 9457 problem+json for everything the API refuses."""

from __future__ import annotations

import logging
from collections.abc import Collection
from http import HTTPStatus
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.routing import Match

from service.db.session import DATABASE_UNAVAILABLE
from service.errors import DlaasError, FieldError, ServiceUnavailable
from service.logs import LogStoreUnavailable

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


# Seconds a client is asked to wait before it tries again.
RETRY_AFTER_SECONDS = 5


def database_unavailable(exc: Exception) -> ServiceUnavailable:
    """The 503 for a request the database could not serve (`exc`, one of
    DATABASE_UNAVAILABLE), with Retry-After; the cause is logged, never sent."""
    log.warning("the database is unavailable: %s", str(exc).splitlines()[0] if str(exc) else exc)
    error = ServiceUnavailable(
        "the database is unavailable (unreachable or restarting); try again shortly"
    )
    error.headers["Retry-After"] = str(RETRY_AFTER_SECONDS)
    return error


def _request_field(loc: tuple[Any, ...]) -> str:
    # ("body", "model_definition") -> "model_definition"; ("query", "limit") -> "limit"
    parts = [str(p) for p in loc[1:]] if loc and loc[0] in ("body", "query", "path") else loc
    return "/".join(str(p) for p in parts) or "request"


def install_problem_handlers(app: FastAPI) -> None:
    @app.exception_handler(DlaasError)
    async def _dlaas(request: Request, exc: DlaasError) -> JSONResponse:
        return dlaas_problem(exc, request.url.path)

    async def _database(request: Request, exc: Exception) -> JSONResponse:
        return dlaas_problem(database_unavailable(exc), request.url.path)

    for unavailable in DATABASE_UNAVAILABLE:
        app.add_exception_handler(unavailable, _database)

    @app.exception_handler(LogStoreUnavailable)
    async def _log_store(request: Request, exc: LogStoreUnavailable) -> JSONResponse:
        error = ServiceUnavailable(f"training logs cannot be read now: {exc}; try again shortly")
        error.headers["Retry-After"] = str(RETRY_AFTER_SECONDS)
        return dlaas_problem(error, request.url.path)

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
        headers = getattr(exc, "headers", None)
        if exc.status_code == 405:
            headers = {**(headers or {}), "Allow": allowed_methods(request)}
        return problem(
            exc.status_code,
            title,
            str(exc.detail),
            slug=title.lower().replace(" ", "-"),
            instance=request.url.path,
            headers=headers,
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


def allowed_methods(request: Request) -> str:
    """Every method some route serves at this path. Starlette's 405 names only the methods of
    the first route whose path matched, though a path is often served by several routes
    (GET and DELETE /v1/trainings/{id}). Each method is tried against the routes as a
    request would be."""
    allowed = []
    for method in _METHODS:
        scope = {**request.scope, "method": method}
        if any(route.matches(scope)[0] == Match.FULL for route in request.app.router.routes):
            allowed.append(method)
    return ", ".join(allowed)


_METHODS = ("DELETE", "GET", "HEAD", "PATCH", "POST", "PUT")


# The problem+json body every 4xx and 5xx carries, as the OpenAPI document shows it.
PROBLEM_SCHEMA: dict[str, Any] = {
    "title": "Problem",
    "description": "RFC 9457 problem details.",
    "type": "object",
    "required": ["type", "title", "status", "detail"],
    "properties": {
        "type": {"type": "string", "description": "urn:dlaas:problem:<slug>"},
        "title": {"type": "string"},
        "status": {"type": "integer"},
        "detail": {"type": "string"},
        "instance": {"type": "string", "description": "The request's path"},
        "errors": {
            "type": "array",
            "description": "The offending fields, each named and with the rule it breaks.",
            "items": {
                "type": "object",
                "required": ["field", "message"],
                "properties": {"field": {"type": "string"}, "message": {"type": "string"}},
            },
        },
    },
}

_PROBLEM_REF = {"$ref": "#/components/schemas/Problem"}
# TensorFlow Serving's paths refuse in its own shape (service.http.serving_errors).
SERVING_PREFIX = "/v1/models"
SERVING_ERROR_SCHEMA: dict[str, Any] = {
    "title": "ServingError",
    "description": "TensorFlow Serving's error body.",
    "type": "object",
    "required": ["error"],
    "properties": {"error": {"type": "string"}},
}
_SERVING_ERROR_REF = {"$ref": "#/components/schemas/ServingError"}
# What a status means when the route does not say more.
_GENERIC = {
    400: "The request is malformed (a body or parameter that cannot be read)",
    401: "No API key, or one that is unknown, revoked or expired",
    403: "The key may not use this operation",
    404: "No such resource for this tenant, or no such path",
    413: "The body is above the size limit",
    422: "A field breaks a rule; `errors` names each field and its rule",
    429: "A limit of the plan, a rate limit or a cap is reached; the detail names it",
    503: "A service the platform needs (the database) is unavailable",
}


def document_problems(document: dict[str, Any], *, public_paths: Collection[str]) -> dict[str, Any]:
    """Make the OpenAPI document say what the API answers when it refuses a request: every
    operation lists its 4xx/5xx with `application/problem+json` and the Problem schema (in
    place of FastAPI's HTTPValidationError, which the app never sends); TensorFlow
    Serving's paths with its `{"error": ...}` body."""
    schemas = document.setdefault("components", {}).setdefault("schemas", {})
    schemas["Problem"] = PROBLEM_SCHEMA
    paths = document.get("paths", {})
    if any(path.startswith(SERVING_PREFIX + "/") for path in paths):
        schemas["ServingError"] = SERVING_ERROR_SCHEMA
    for path, operations in paths.items():
        serving = path.startswith(SERVING_PREFIX + "/")
        for operation in operations.values():
            responses: dict[str, Any] = operation.setdefault("responses", {})
            # What the request gate and the routers may answer any keyed request; a public
            # path (the probes) lists its own.
            codes = {int(c) for c in responses if c.isdigit() and int(c) >= 400}
            if path not in public_paths:
                # 429: the request rates of every keyed request (service.http.rates), and
                # plan limits, prediction rates and the cap on followed logs.
                codes |= {400, 401, 403, 404, 422, 429, 503}
                if "requestBody" in operation:
                    codes.add(413)
            for code in sorted(codes):
                documented = responses.setdefault(str(code), {})
                documented.setdefault("description", _GENERIC.get(code, HTTPStatus(code).phrase))
                if documented["description"] == "Validation Error":
                    documented["description"] = _GENERIC[422]
                if serving:
                    documented["content"] = {"application/json": {"schema": _SERVING_ERROR_REF}}
                else:
                    documented["content"] = {PROBLEM_JSON: {"schema": _PROBLEM_REF}}
    text = repr(document.get("paths", {}))
    for unused in ("HTTPValidationError", "ValidationError"):
        if f"#/components/schemas/{unused}'" not in text:
            schemas.pop(unused, None)
    return document
