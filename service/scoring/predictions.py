"""Predictions: POST /v1/deployments/{id}/predictions.

Where scoring runs decides which router an app gets: `router` scores in this process
(the embedded default, and the scoring service itself); `proxy_router` forwards to the
scoring service at DLAAS_SCORING_URL, which answers with the same code. `serving` is the
part of an app's lifespan that starts either.
"""

from __future__ import annotations

import re
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Annotated, Any
from urllib.parse import quote

import httpx
from fastapi import APIRouter, FastAPI, Query, Request, Response
from starlette.types import ASGIApp, Receive, Scope, Send

from service.db.session import DATABASE_UNAVAILABLE
from service.domain.versions import MAX_VERSION
from service.errors import BadRequest, DlaasError, FieldError, ServiceUnavailable
from service.http.auth import caller_key
from service.http.limits import CallerCheck
from service.http.problems import database_unavailable, dlaas_problem
from service.platform import Platform
from service.scoring.inputs import encode_answer
from service.scoring.service import ScoringService

_PATH = "/v1/deployments/{deployment_id}/predictions"
_GRPC_GRACE_SECONDS = 3
_FORWARDED_HEADERS = ("retry-after", "x-ratelimit-limit", "x-ratelimit-remaining")

# The body is read raw (any content type, numbers parsed once); this documents it.
_BODY_DOC: dict[str, Any] = {
    "requestBody": {
        "required": True,
        "content": {
            "application/json": {
                "schema": {
                    "type": "object",
                    "description": "TensorFlow Serving's REST forms: instances (row format) "
                    "or inputs (columnar), or WML's values (with fields); optional "
                    "signature_name (default serving_default).",
                    "properties": {
                        "signature_name": {"type": "string"},
                        "instances": {"type": "array", "items": {}},
                        "inputs": {},
                        "values": {"type": "array", "items": {}},
                        "fields": {"type": "array", "items": {"type": "string"}},
                    },
                },
                "example": {"instances": [[1.0, 2.0], [0.5, -1.0]]},
            }
        },
    }
}
_RESPONSES: dict[int | str, dict[str, Any]] = {
    200: {"description": "{predictions}, {outputs} or {fields, values}, as asked"},
    400: {"description": "The payload does not fit the signature (the field is named)"},
    404: {"description": "No such deployment of the caller's, or version or label of it"},
    409: {"description": "The deployment is not READY"},
    429: {"description": "Over the plan's predictions per minute; see Retry-After"},
}

router = APIRouter(tags=["deployments"])


_VERSION_DOC = (
    "The version to answer with (a number the deployment's versions list); default: the "
    "one the 'stable' label points at where it is set, else the latest loaded version."
)
_LABEL_DOC = "A label (stable, canary, ...) naming the version to answer with."


@router.post(_PATH, responses=_RESPONSES, openapi_extra=_BODY_DOC)
async def create_prediction(
    deployment_id: str,
    request: Request,
    version: Annotated[int | None, Query(ge=1, description=_VERSION_DOC)] = None,
    label: Annotated[str | None, Query(min_length=1, description=_LABEL_DOC)] = None,
) -> Response:
    """Score instances with the deployed model (a version of it: `version` or `label`)."""
    # Declared for the OpenAPI document and for apps without FastPredictions; in the
    # shipped apps FastPredictions answers before routing.
    return await predict(request, deployment_id)


def requested_version(request: Request) -> tuple[int | None, str | None]:
    """The `version` and `label` query parameters (both optional)."""
    query = request.query_params
    version, label = query.get("version"), query.get("label")
    number: int | None = None
    if version is not None:
        if not version.isdigit() or not 1 <= int(version) <= MAX_VERSION:
            message = f"'{version}' is not a version number (an integer from 1)"
            raise BadRequest(f"version: {message}", errors=[FieldError("version", message)])
        number = int(version)
    if label is not None and not label:
        raise BadRequest("label: is empty", errors=[FieldError("label", "is empty")])
    return number, label


async def predict(request: Request, deployment_id: str) -> Response:
    """The answer to a prediction request. The hot path: no FastAPI dependencies, and no
    worker thread once the caller and the deployment are known."""
    scoring: ScoringService = request.app.state.scoring
    version, label = requested_version(request) if request.scope["query_string"] else (None, None)
    with scoring.arriving(deployment_id) as arrived:
        tenant, target = await scoring.caller(caller_key(request), deployment_id, version, label)
        body = await request.body()
        answer, decision = await scoring.predict(tenant, target, body, arrived)
    return Response(
        encode_answer(answer),
        media_type="application/json",
        headers={
            "X-RateLimit-Limit": str(decision.limit),
            "X-RateLimit-Remaining": str(decision.remaining),
        },
    )


_PREDICTIONS = re.compile(r"/v1/deployments/([^/]+)/predictions")


class FastPredictions:
    """Answers POST /v1/deployments/{id}/predictions when scoring runs in this process,
    ahead of routing: the framework's exception middleware, router, request handler and
    dependency solving took about half of the event loop's time per prediction (py-spy,
    batch-1 requests at concurrency 8). Same code (`predict`) and same problem+json
    answers as the route; the outer middleware (body size limit, the 500 handler) still
    applies."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and scope["method"] == "POST":
            match = _PREDICTIONS.fullmatch(scope["path"])
            if match is not None and hasattr(scope["app"].state, "scoring"):
                request = Request(scope, receive)
                response: Response
                try:
                    response = await predict(request, match.group(1))
                except DlaasError as exc:
                    response = dlaas_problem(exc, scope["path"])
                except DATABASE_UNAVAILABLE as exc:  # ahead of the app's handlers: 503 here
                    response = dlaas_problem(database_unavailable(exc), scope["path"])
                await response(scope, receive, send)
                return
        await self.app(scope, receive, send)


proxy_router = APIRouter(tags=["deployments"])


@proxy_router.post(_PATH, responses=_RESPONSES, openapi_extra=_BODY_DOC)
async def create_prediction_forwarded(
    deployment_id: str,
    request: Request,
    version: Annotated[int | None, Query(ge=1, description=_VERSION_DOC)] = None,
    label: Annotated[str | None, Query(min_length=1, description=_LABEL_DOC)] = None,
) -> Response:
    """Score instances with the deployed model (answered by the scoring service)."""
    client: httpx.AsyncClient = request.app.state.scoring_client
    headers = {k: v for k, v in request.headers.items() if k == "content-type"}
    # The caller's key, whether it came as a header or in the dashboard's session cookie.
    headers["authorization"] = f"Bearer {caller_key(request)}"
    try:
        upstream = await client.post(
            _PATH.format(deployment_id=quote(deployment_id, safe="")),
            params=request.query_params,
            content=await request.body(),
            headers=headers,
        )
    except httpx.HTTPError as e:
        raise ServiceUnavailable(
            f"the scoring service at {client.base_url} did not answer ({type(e).__name__})"
        ) from e
    forwarded = {k: v for k, v in upstream.headers.items() if k.lower() in _FORWARDED_HEADERS}
    return Response(
        upstream.content,
        status_code=upstream.status_code,
        headers=forwarded,
        media_type=upstream.headers.get("content-type"),
    )


def predictions_router(platform: Platform, *, local: bool = False) -> APIRouter:
    """The router for where this app's predictions are scored."""
    return proxy_router if platform.settings.scoring_url and not local else router


@asynccontextmanager
async def serving(app: FastAPI, platform: Platform, *, local: bool = False) -> AsyncIterator[None]:
    """Start scoring in this process, with TensorFlow Serving's gRPC API on
    DLAAS_SCORING_GRPC_PORT when set (its port in `app.state.grpc_port`), or the client of
    the separate scoring service."""
    url = platform.settings.scoring_url
    if url and not local:
        async with httpx.AsyncClient(base_url=url, timeout=60) as client:
            app.state.scoring_client = client
            yield
        return
    scoring = ScoringService(platform)
    app.state.scoring = scoring
    scoring.start()
    grpc_server = None
    try:
        if platform.settings.scoring_grpc_port is not None:
            from service.scoring.grpc_server import start_server

            callers = CallerCheck(platform, app.state.request_rates)
            grpc_server, app.state.grpc_port = await start_server(
                scoring, platform.settings, callers
            )
        yield
    finally:
        if grpc_server is not None:
            # Calls under way get a few seconds to finish; new ones are refused at once.
            await grpc_server.stop(_GRPC_GRACE_SECONDS)
        await scoring.stop()
