"""TensorFlow Serving's REST API, on the API and the scoring service:

- `GET /v1/models/{name}[/versions/{v} | /labels/{label}]`: the model's status;
- `GET /v1/models/{name}[/versions/{v} | /labels/{label}]/metadata`: its SignatureDefs;
- `POST /v1/models/{name}[/versions/{v} | /labels/{label}]:predict`, `:classify`,
  `:regress`.

`{name}` is the deployment's id or its name; the caller's key is checked as on every route
(`Authorization: Bearer`; another tenant's model is as absent as a missing one), and
predictions count against the same rate limit as the platform's route. Answers and
refusals have TensorFlow Serving's shapes (`tfs_json`, `tfs_metadata`; refusals
`{"error": ...}` with its status codes, `service.http.serving_errors`). The routes only
dispatch: the translation lives in `tfs_json`, `tf_example`, `tfs_infer`, the version in
`versions.resolve_version`.
"""

from __future__ import annotations

import re
from functools import cache
from typing import Any

import httpx
import orjson
from fastapi import APIRouter, Request, Response
from starlette.types import ASGIApp, Receive, Scope, Send

from service.db.session import DATABASE_UNAVAILABLE
from service.domain.signature import CLASSIFY_METHOD, REGRESS_METHOD
from service.errors import BadRequest, DlaasError, ServiceUnavailable
from service.http.auth import caller_key
from service.http.problems import database_unavailable
from service.http.serving_errors import serving_error
from service.platform import Platform
from service.scoring import tfs_infer, tfs_json, tfs_metadata
from service.scoring.ratelimit import RateDecision
from service.scoring.service import ScoringService
from service.scoring.tensors import TensorCodec
from service.scoring.tf_example import examples_from_request
from service.scoring.tfs_protos import ServingMessages, serving_messages
from service.scoring.versions import resolve_version

PREFIX = "/v1/models"
_SPEC = r"/v1/models/([^/:]+)(?:/versions/(\d+)|/labels/([^/:]+))?"
_POST = re.compile(_SPEC + r":(classify|regress|predict)", re.IGNORECASE)
_GET = re.compile(_SPEC + r"(/metadata)?", re.IGNORECASE)
_FORWARDED_HEADERS = ("retry-after", "x-ratelimit-limit", "x-ratelimit-remaining")
_RESPONSES: dict[int | str, dict[str, Any]] = {
    200: {"description": "TensorFlow Serving's answer"},
    400: {"description": '{"error": ...}: the request does not fit the model'},
    404: {"description": '{"error": ...}: no such model (or version) of the caller\'s'},
}

router = APIRouter(tags=["tensorflow-serving"])
proxy_router = APIRouter(tags=["tensorflow-serving"])


@cache
def _messages() -> tuple[ServingMessages, TensorCodec]:
    messages = serving_messages()
    # Only data types are asked of this codec; it converts no tensors.
    return messages, TensorCodec(messages.data_types, max_bytes=0)


def _malformed(request: Request) -> BadRequest:
    return BadRequest(f"Malformed request: {request.method} {request.url.path}")


def _spec(match: re.Match[str]) -> tuple[str, int | None, str | None]:
    name, version, label = match.group(1), match.group(2), match.group(3)
    return name, None if version is None else int(version), label


def _json(document: Any) -> Response:
    return Response(orjson.dumps(document), media_type="application/json")


def _answer(body: bytes, decision: RateDecision) -> Response:
    return Response(
        body,
        media_type="application/json",
        headers={
            "X-RateLimit-Limit": str(decision.limit),
            "X-RateLimit-Remaining": str(decision.remaining),
        },
    )


@router.get(PREFIX + "/{path:path}", responses=_RESPONSES)
async def model_status_or_metadata(path: str, request: Request) -> Response:
    """A model's status (`model_version_status`), or with `/metadata` its SignatureDefs,
    as TensorFlow Serving answers them."""
    return await _refusing(_get(request))


@router.post(PREFIX + "/{path:path}", responses=_RESPONSES)
async def model_inference(path: str, request: Request) -> Response:
    """`:predict`, `:classify` or `:regress`, with TensorFlow Serving's bodies."""
    return await _refusing(_post(request))


async def _refusing(answer: Any) -> Response:
    try:
        response: Response = await answer
        return response
    except DlaasError as e:
        return serving_error(e)
    except DATABASE_UNAVAILABLE as e:
        return serving_error(database_unavailable(e))


async def _get(request: Request) -> Response:
    match = _GET.fullmatch(request.url.path)
    if match is None:
        raise _malformed(request)
    name, version, label = _spec(match)
    scoring: ScoringService = request.app.state.scoring
    messages, codec = _messages()
    if not match.group(4):  # the status: of a model in any state
        target, state, message = await scoring.state_of(caller_key(request), name)
        asked = (
            None if version is None and label is None else resolve_version(target, version, label)
        )
        statuses = tfs_metadata.version_statuses(target, state, message, asked)
        return _json(tfs_metadata.status_json(messages, statuses))
    _, target = await scoring.caller(caller_key(request), name, version, label, by_name=True)
    return _json(
        tfs_metadata.metadata_json(messages, codec, name, target.version, target.signatures)
    )


async def _post(request: Request) -> Response:
    match = _POST.fullmatch(request.url.path)
    if match is None:
        raise _malformed(request)
    name, version, label = _spec(match)
    verb = match.group(4).lower()
    scoring: ScoringService = request.app.state.scoring
    with scoring.arriving(name) as arrived:
        tenant, target = await scoring.caller(
            caller_key(request), name, version, label, by_name=True
        )
        payload = tfs_json.load_body(await request.body())
        if verb == "predict":
            checked = tfs_json.predict_request(payload, target.signatures)
            outputs, decision = await scoring.score(tenant, checked, target, arrived)
            return _answer(tfs_json.predict_answer(checked, outputs), decision)
        method = CLASSIFY_METHOD if verb == "classify" else REGRESS_METHOD
        signature = tfs_infer.inference_signature(
            target.signatures, tfs_json.signature_name(payload), method
        )
        examples = examples_from_request(payload, _messages()[0].Example)
        checked = tfs_infer.examples_request(signature, examples)
        outputs, decision = await scoring.score(tenant, checked, target, arrived)
    if method == CLASSIFY_METHOD:
        classes = tfs_infer.classifications(signature, outputs, checked.rows)
        return _answer(tfs_json.classify_answer(classes), decision)
    values = tfs_infer.regressions(signature, outputs, checked.rows)
    return _answer(tfs_json.regress_answer(values), decision)


class FastServing:
    """Answers GET and POST under /v1/models ahead of routing, as
    `predictions.FastPredictions` does for the platform's route: the same code as the
    routes (`_get`, `_post`, `_forward`; the outer middleware still applies), and every
    path there, even one no route pattern matches (a newline in it), is TensorFlow
    Serving's (`Malformed request` 400 `{"error"}`)."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if (
            scope["type"] == "http"
            and scope["method"] in ("GET", "POST")
            and scope["path"].startswith(PREFIX + "/")
        ):
            state = scope["app"].state
            request = Request(scope, receive)
            response: Response
            if hasattr(state, "scoring"):
                answer = _get(request) if scope["method"] == "GET" else _post(request)
                response = await _refusing(answer)
            elif hasattr(state, "scoring_client"):
                response = await _forward(request)
            else:
                await self.app(scope, receive, send)
                return
            await response(scope, receive, send)
            return
        await self.app(scope, receive, send)


@proxy_router.get(PREFIX + "/{path:path}", responses=_RESPONSES)
async def model_status_or_metadata_forwarded(path: str, request: Request) -> Response:
    """A model's status or metadata (answered by the scoring service)."""
    return await _forward(request)


@proxy_router.post(PREFIX + "/{path:path}", responses=_RESPONSES)
async def model_inference_forwarded(path: str, request: Request) -> Response:
    """`:predict`, `:classify` or `:regress` (answered by the scoring service)."""
    return await _forward(request)


async def _forward(request: Request) -> Response:
    client: httpx.AsyncClient = request.app.state.scoring_client
    headers = {k: v for k, v in request.headers.items() if k == "content-type"}
    headers["authorization"] = f"Bearer {caller_key(request)}"
    try:
        upstream = await client.request(
            request.method, request.url.path, content=await request.body(), headers=headers
        )
    except httpx.HTTPError as e:
        return serving_error(
            ServiceUnavailable(
                f"the scoring service at {client.base_url} did not answer ({type(e).__name__})"
            )
        )
    forwarded = {k: v for k, v in upstream.headers.items() if k.lower() in _FORWARDED_HEADERS}
    return Response(
        upstream.content,
        status_code=upstream.status_code,
        headers=forwarded,
        media_type=upstream.headers.get("content-type"),
    )


def tfs_router(platform: Platform, *, local: bool = False) -> APIRouter:
    """The router for where this app's models are served (as `predictions_router`)."""
    return proxy_router if platform.settings.scoring_url and not local else router
