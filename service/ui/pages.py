"""The dashboard's pages. Thin: each says who is signed in and renders its template; the
template's script reads the page's data from the public /v1 API with the session cookie.
Sign-in and sign-out are the only form handlers: they set and clear that cookie."""

from __future__ import annotations

from contextlib import suppress
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any

from fastapi import APIRouter, FastAPI, Form, Request
from fastapi.responses import FileResponse, PlainTextResponse, RedirectResponse, Response
from fastapi.staticfiles import StaticFiles
from fastapi.templating import Jinja2Templates
from starlette.concurrency import run_in_threadpool

from service.auth import TenantRef, keys_match
from service.errors import DlaasError, TooManyRequests
from service.http.auth import (
    CSRF_HEADER,
    SESSION_COOKIE,
    authenticate,
    open_session,
    same_origin,
    seal_session,
)
from service.http.limits import client_address
from service.http.rates import RequestRates
from service.platform import Platform
from service.ui import assets
from service.ui.headers import DashboardHeaders

PREFIX = "/ui"
HERE = Path(__file__).resolve().parent
templates = Jinja2Templates(directory=HERE / "templates")
router = APIRouter(prefix=PREFIX, include_in_schema=False)


@dataclass(frozen=True)
class Viewer:
    """Who is signed in: the admin, or a tenant."""

    tenant: TenantRef | None

    @property
    def admin(self) -> bool:
        return self.tenant is None


def _platform(request: Request) -> Platform:
    platform: Platform = request.app.state.platform
    return platform


def identify(platform: Platform, key: str) -> Viewer:
    """The viewer a key makes (blocking: authenticate may read the database). Raises the
    API's Unauthorized for a key that is not valid."""
    if keys_match(key, platform.admin_key):
        return Viewer(tenant=None)
    return Viewer(tenant=authenticate(platform, key))


def _viewer(request: Request) -> Viewer | None:
    sealed = request.cookies.get(SESSION_COOKIE)
    if not sealed:
        return None
    platform = _platform(request)
    try:
        return identify(platform, open_session(platform, sealed))
    except DlaasError:  # expired, or the key was revoked since
        return None


def _to_sign_in() -> Response:
    response = RedirectResponse(f"{PREFIX}/sign-in", status_code=303)
    response.delete_cookie(SESSION_COOKIE, path="/")
    return response


def _render(
    request: Request, template: str, viewer: Viewer | None, status_code: int = 200, **context: Any
) -> Response:
    missing = assets.missing(_platform(request).settings)
    if missing:
        return PlainTextResponse(
            f"{assets.MISSING_HINT}\nMissing: {', '.join(missing)}", status_code=503
        )
    return templates.TemplateResponse(
        request,
        template,
        {"viewer": viewer, "csrf_header": CSRF_HEADER, **context},
        status_code=status_code,
    )


def _page(request: Request, template: str, *, admin: bool = False, **context: Any) -> Response:
    """A signed-in page: the tenants page for the admin, the others for a tenant."""
    viewer = _viewer(request)
    if viewer is None:
        return _to_sign_in()
    if viewer.admin != admin:
        return RedirectResponse(f"{PREFIX}/", status_code=303)
    return _render(request, template, viewer, **context)


@router.get("")
@router.get("/")
def home(request: Request) -> Response:
    viewer = _viewer(request)
    if viewer is None:
        return _to_sign_in()
    target = "tenants" if viewer.admin else "trainings"
    return RedirectResponse(f"{PREFIX}/{target}", status_code=303)


@router.get("/sign-in")
def sign_in_page(request: Request) -> Response:
    return _render(request, "sign_in.html", None)


@router.post("/sign-in")
async def sign_in(request: Request, api_key: Annotated[str, Form()] = "") -> Response:
    """Checks the key as the API would and keeps it, sealed, in the session cookie. A wrong
    key counts against the address's budget of those, as at the API (service.http.rates):
    once it is spent, sign-in answers 429 without looking the key up."""
    if not same_origin(request):
        return _render(
            request, "sign_in.html", None, status_code=403, error="cross-site sign-in refused"
        )
    key = api_key.strip()
    platform = _platform(request)
    rates: RequestRates = request.app.state.request_rates
    address = client_address(request.scope)
    try:
        await rates.check_failures(address)
        if not key:
            raise ValueError("enter an API key")
        await run_in_threadpool(identify, platform, key)
    except TooManyRequests as e:
        response = _render(request, "sign_in.html", None, status_code=429, error=e.detail)
        response.headers.update(e.headers)
        return response
    except (DlaasError, ValueError) as e:
        error = str(e) if isinstance(e, ValueError) else e.detail
        with suppress(TooManyRequests):
            await rates.failed(address)
        return _render(request, "sign_in.html", None, status_code=401, error=error)
    response = RedirectResponse(f"{PREFIX}/", status_code=303)
    response.set_cookie(
        SESSION_COOKIE,
        seal_session(platform, key),
        max_age=platform.settings.session_max_age,
        path="/",
        httponly=True,
        samesite="strict",
        secure=request.url.scheme == "https",
    )
    return response


@router.post("/sign-out")
def sign_out(request: Request) -> Response:
    if not same_origin(request):
        return PlainTextResponse("cross-site sign-out refused", status_code=403)
    return _to_sign_in()


@router.get("/trainings")
def trainings_page(request: Request) -> Response:
    return _page(request, "trainings.html")


@router.get("/trainings/new")
def submit_page(request: Request) -> Response:
    return _page(request, "submit.html")


@router.get("/trainings/{training_id}")
def training_page(request: Request, training_id: str) -> Response:
    return _page(request, "training.html", training_id=training_id)


@router.get("/deployments")
def deployments_page(request: Request) -> Response:
    return _page(request, "deployments.html")


@router.get("/deployments/{deployment_id}")
def deployment_page(request: Request, deployment_id: str) -> Response:
    return _page(request, "deployment.html", deployment_id=deployment_id)


@router.get("/keys")
def keys_page(request: Request) -> Response:
    return _page(request, "keys.html")


@router.get("/tenants")
def tenants_page(request: Request) -> Response:
    return _page(request, "tenants.html", admin=True)


@router.get("/vendor/{name}")
def vendor(request: Request, name: str) -> Response:
    """A front-end library installed by `make ui-assets`."""
    path = assets.vendor_path(_platform(request).settings, name)
    if path is None:
        return PlainTextResponse(f"no dashboard file {name!r}", status_code=404)
    if not path.is_file():
        return PlainTextResponse(assets.MISSING_HINT, status_code=503)
    return FileResponse(path, headers={"Cache-Control": "no-cache"})


def install(app: FastAPI) -> None:
    """Serve the dashboard from `app` (its pages and its own scripts and styles), every
    answer with the headers of service.ui.headers."""
    app.add_middleware(DashboardHeaders, prefix=PREFIX)
    app.include_router(router)
    app.mount(f"{PREFIX}/static", StaticFiles(directory=HERE / "static"), name="ui-static")
