"""What a request passes before a byte of its body is read: the caller's key and its
request rate (service.http.rates), then the size of the body for its route.

Without this, a route's body is read and parsed (FastAPI reads it before it solves the
dependency that checks the key) before the caller is known, so anyone could make the
server read, and hold, as much as the largest upload allows. Here the key is checked from
the headers alone (401 or 403 problem+json, the body never read), then the declared size
against the route's cap (413 at once), and a body without a declared size is counted as it
streams in and cut at the cap.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Collection
from dataclasses import dataclass

from starlette.concurrency import run_in_threadpool
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Match
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from service.auth import TenantRef, hash_api_key, keys_match
from service.db.session import DATABASE_UNAVAILABLE
from service.errors import DlaasError, PayloadTooLarge, TooManyRequests, Unauthorized
from service.http.auth import authenticate, caller_key
from service.http.problems import database_unavailable, dlaas_problem
from service.http.rates import RequestRates
from service.http.serving_errors import serving_error
from service.platform import Platform

_PREDICTIONS = re.compile(r"/v1/deployments/[^/]+/predictions")
# TensorFlow Serving's REST paths: forwarded with predictions, refused in its own shape.
_SERVING = "/v1/models"
_SERVING_INFERENCE = re.compile(r"/v1/models/[^:]+:(?:predict|classify|regress)", re.IGNORECASE)


@dataclass(frozen=True)
class BodyCap:
    """The most bytes a request's body may have, and the setting that says so."""

    max_bytes: int
    setting: str

    def detail(self) -> str:
        return (
            f"the request body is larger than the limit of {self.max_bytes} bytes "
            f"for this route ({self.setting})"
        )


@dataclass(frozen=True)
class BodyLimits:
    """Each route's body cap: the training upload is large, predictions middling, every
    other body (small JSON documents) small."""

    json: BodyCap
    upload: BodyCap
    predictions: BodyCap

    def cap(self, method: str, path: str) -> BodyCap:
        if method == "POST":
            if path == "/v1/trainings":
                return self.upload
            if _PREDICTIONS.fullmatch(path) or _SERVING_INFERENCE.fullmatch(path):
                return self.predictions
        return self.json


class _TooLarge(HTTPException):
    """An HTTPException, so body parsers that wrap other errors as 400 let it through and
    the app's own problem handler renders it."""

    def __init__(self, cap: BodyCap) -> None:
        super().__init__(413, cap.detail())


class CallerCheck:
    """Who a request's key is and whether it may make the request now (the key's tenant
    and its plan's rate; for a missing or wrong key, its address's budget of those): the
    check the request gate and the scoring gRPC port make before reading a request."""

    def __init__(self, platform: Platform, rates: RequestRates) -> None:
        self.platform = platform
        self.rates = rates

    async def check(
        self, key_of: Callable[[], str], address: str, *, count: bool = True
    ) -> TenantRef | None:
        """The caller's tenant (None for the admin key). Unauthorized unless `key_of`
        gives a key of this platform; TooManyRequests when the tenant's rate (unless not
        `count`: another process counts the request), or the address's budget of bad
        keys, is spent."""
        try:
            tenant = await self._tenant(key_of, address)
        except Unauthorized:
            await self.rates.failed(address)  # TooManyRequests once the budget is spent
            raise
        if tenant is not None and count:
            plan = self.platform.catalog.plans.get(tenant.plan)
            if plan is not None:
                await self.rates.tenant_request(tenant, plan)
        return tenant

    async def _tenant(self, key_of: Callable[[], str], address: str) -> TenantRef | None:
        key = key_of()
        key_hash = hash_api_key(key)
        keys = self.platform.tenant_keys
        known = keys.get(key_hash)
        if known is not None:
            return known
        if keys_match(key, self.platform.admin_key):
            return None
        # A key this process does not know costs a database lookup: not once the address
        # has spent its budget of bad ones. (A key it knows, whose revocations are due to
        # be looked at again, is looked up: the bad keys of its address do not lock it out.)
        if not keys.remembered(key_hash):
            await self.rates.check_failures(address)
        try:
            return await run_in_threadpool(authenticate, self.platform, key)
        except DATABASE_UNAVAILABLE as e:  # out here no exception handler of the app sees it
            raise database_unavailable(e) from e


class RequestGate:
    """ASGI middleware: the caller's key and the body's size are checked before the body
    is read (see the module's docstring).

    Every path a route serves but `public_paths` needs a key: the admin key, or a tenant's
    key that `authenticate` knows (a cached key costs no thread; a new one is looked up in
    a worker thread). Paths under `public_prefixes` (the dashboard's pages, which ask for
    a key themselves) need none. Whether the key may do what the route does is still the route's
    question (a tenant key on an admin route is a 403 there).

    Each tenant's request takes a token of its plan's rate (`rates`), whether the key came
    in a header or the dashboard's cookie; a request refused for its key counts against its
    client address, whose spent budget refuses its requests with keys not known yet.
    """

    def __init__(
        self,
        app: ASGIApp,
        platform: Platform,
        limits: BodyLimits,
        rates: RequestRates,
        public_paths: Collection[str] = (),
        public_prefixes: Collection[str] = (),
        forwarded_predictions: bool = False,
    ) -> None:
        self.app = app
        self.forwarded_predictions = forwarded_predictions
        self.platform = platform
        self.limits = limits
        self.callers = CallerCheck(platform, rates)
        self.public_paths = frozenset(public_paths)
        self.public_prefixes = tuple(public_prefixes)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        path: str = scope["path"]
        if path not in self.public_paths and not path.startswith(self.public_prefixes):
            try:
                await self._check_caller(scope)
            except DlaasError as exc:
                # A path no route serves is a 404 whoever asks (the body is not read).
                if isinstance(exc, TooManyRequests) or _routed(scope):
                    await self._refuse(_refusal(exc, path), scope, receive, send)
                    return
        cap = self.limits.cap(scope["method"], path)
        declared = _header(scope, b"content-length")
        if declared is not None and declared.isdigit() and int(declared) > cap.max_bytes:
            response = _refusal(PayloadTooLarge(cap.detail()), path)
            await self._refuse(response, scope, receive, send)
            return
        seen = 0
        started = False

        async def limited_receive() -> Message:
            nonlocal seen
            message = await receive()
            if message["type"] == "http.request":
                seen += len(message.get("body", b""))
                if seen > cap.max_bytes:
                    raise _TooLarge(cap)
            return message

        async def tracking_send(message: Message) -> None:
            nonlocal started
            if message["type"] == "http.response.start":
                started = True
            await send(message)

        try:
            await self.app(scope, limited_receive, tracking_send)
        except _TooLarge:
            if not started:
                response = _refusal(PayloadTooLarge(cap.detail()), path)
                await self._refuse(response, scope, receive, send)

    async def _check_caller(self, scope: Scope) -> None:
        # A prediction this app forwards to the scoring service is counted there.
        count = not (
            self.forwarded_predictions
            and scope["method"] == "POST"
            and (
                _PREDICTIONS.fullmatch(scope["path"]) or _SERVING_INFERENCE.fullmatch(scope["path"])
            )
        )
        key_of = lambda: caller_key(Request(scope))  # noqa: E731
        await self.callers.check(key_of, client_address(scope), count=count)

    @staticmethod
    async def _refuse(response: Response, scope: Scope, receive: Receive, send: Send) -> None:
        """Answer without reading the body. A request that has one gets its connection
        closed after the answer, so the server reads no more of a body the client may
        still be sending."""
        length = _header(scope, b"content-length")
        if _header(scope, b"transfer-encoding") is not None or length not in (None, "0"):
            response.headers["Connection"] = "close"
        await response(scope, receive, send)


def _refusal(exc: DlaasError, path: str) -> Response:
    """problem+json, or on TensorFlow Serving's paths its `{"error": ...}`."""
    if path == _SERVING or path.startswith(_SERVING + "/"):
        return serving_error(exc)
    return dlaas_problem(exc, path)


def _routed(scope: Scope) -> bool:
    """Whether a route of the app serves the path (with this method or another)."""
    app = scope.get("app")
    router = getattr(app, "router", None)
    if router is None:
        return True
    return any(route.matches(scope)[0] is not Match.NONE for route in router.routes)


def client_address(scope: Scope) -> str:
    """The address of the connection's peer (a proxy's headers are not trusted)."""
    client = scope.get("client")
    return str(client[0]) if client else "unknown"


def _header(scope: Scope, name: bytes) -> str | None:
    for key, value in scope["headers"]:
        if key == name:
            return bytes(value).decode("latin-1")
    return None
