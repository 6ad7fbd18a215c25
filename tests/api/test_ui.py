"""The dashboard's session: sign-in keeps the key sealed in an HttpOnly, SameSite=Strict
cookie that authenticates the public API's calls, state-changing ones only from the
dashboard's own pages; sign-out clears it; the pages need it, and say clearly when the
front-end libraries were not installed."""

from __future__ import annotations

import threading
from http.cookies import SimpleCookie
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import ClassVar

import pytest
from fastapi.testclient import TestClient

from service.api.app import create_app
from service.http.auth import CSRF_HEADER, SESSION_COOKIE
from service.platform import Platform
from service.settings import Settings
from tests.conftest import ADMIN_KEY, create_tenant, submit

SAME_SITE = {"Origin": "http://testserver", CSRF_HEADER: "1"}


def key_of(headers: dict[str, str]) -> str:
    return headers["Authorization"].removeprefix("Bearer ")


def sign_in(client: TestClient, key: str) -> SimpleCookie:
    r = client.post(
        "/ui/sign-in",
        data={"api_key": key},
        headers={"Origin": "http://testserver"},
        follow_redirects=False,
    )
    assert r.status_code == 303, r.text
    cookie = SimpleCookie()
    cookie.load(r.headers["set-cookie"])
    return cookie


def test_sign_in_sets_a_sealed_httponly_strict_cookie(
    client: TestClient, tenant: dict[str, str]
) -> None:
    key = key_of(tenant)
    r = client.post(
        "/ui/sign-in",
        data={"api_key": key},
        headers={"Origin": "http://testserver"},
        follow_redirects=False,
    )
    assert r.status_code == 303
    assert r.headers["location"] == "/ui/"
    raw = r.headers["set-cookie"]
    cookie = SimpleCookie()
    cookie.load(raw)
    morsel = cookie[SESSION_COOKIE]
    assert morsel["httponly"] is True
    assert morsel["samesite"] == "strict"
    assert morsel["path"] == "/"
    assert int(morsel["max-age"]) > 0
    assert key not in raw  # sealed, not the key itself
    # The cookie alone authenticates the public API's reads.
    client.headers.clear()
    assert client.get("/v1/trainings").status_code == 200
    home = client.get("/ui/", follow_redirects=False)
    assert home.headers["location"] == "/ui/trainings"
    page = client.get("/ui/trainings")
    assert page.status_code == 200
    assert "tenant <strong>acme</strong>" in page.text
    assert '<a href="/ui/trainings" aria-current="page">Trainings</a>' in page.text
    assert key not in page.text


def test_a_wrong_key_is_an_error_on_the_sign_in_page(client: TestClient) -> None:
    r = client.post(
        "/ui/sign-in", data={"api_key": "not-a-key"}, headers={"Origin": "http://testserver"}
    )
    assert r.status_code == 401
    assert "the API key is not valid" in r.text
    assert SESSION_COOKIE not in r.headers.get("set-cookie", "")
    assert client.get("/ui/trainings", follow_redirects=False).headers["location"] == (
        "/ui/sign-in"
    )


def test_state_changing_calls_with_the_cookie_need_the_pages_origin_and_header(
    client: TestClient, tenant: dict[str, str]
) -> None:
    sign_in(client, key_of(tenant))
    body = {"training_id": "nope"}
    # A cross-site form or fetch: no custom header, a foreign Origin.
    cross = client.post("/v1/deployments", json=body, headers={"Origin": "https://evil.example"})
    assert cross.status_code == 403
    assert cross.headers["content-type"] == "application/problem+json"
    assert CSRF_HEADER in cross.json()["detail"]
    forged = client.post(
        "/v1/deployments", json=body, headers={"Origin": "https://evil.example", CSRF_HEADER: "1"}
    )
    assert forged.status_code == 403
    assert "cross-site" in forged.json()["detail"]
    # The dashboard's own call passes the gate (and meets the route: no such training).
    own = client.post("/v1/deployments", json=body, headers=SAME_SITE)
    assert own.status_code == 404, own.text
    # A client's Authorization header needs neither.
    bearer = client.post("/v1/deployments", json=body, headers=tenant)
    assert bearer.status_code == 404


def test_the_cookie_submits_a_training_from_the_page(
    client: TestClient, tenant: dict[str, str]
) -> None:
    sign_in(client, key_of(tenant))
    created = submit(client, SAME_SITE)
    assert created.status_code == 201, created.text
    listed = client.get("/v1/trainings").json()["items"]
    assert [t["id"] for t in listed] == [created.json()["id"]]


def test_sign_out_clears_the_cookie(client: TestClient, tenant: dict[str, str]) -> None:
    sign_in(client, key_of(tenant))
    assert client.get("/v1/trainings").status_code == 200
    r = client.post("/ui/sign-out", headers={"Origin": "http://testserver"}, follow_redirects=False)
    assert r.status_code == 303
    assert r.headers["location"] == "/ui/sign-in"
    cookie = SimpleCookie()
    cookie.load(r.headers["set-cookie"])
    assert cookie[SESSION_COOKIE].value == ""
    assert int(cookie[SESSION_COOKIE]["max-age"]) == 0
    assert SESSION_COOKIE not in client.cookies
    assert client.get("/v1/trainings").status_code == 401


def test_a_cross_site_sign_in_is_refused(client: TestClient, tenant: dict[str, str]) -> None:
    r = client.post(
        "/ui/sign-in", data={"api_key": key_of(tenant)}, headers={"Origin": "https://evil.example"}
    )
    assert r.status_code == 403
    assert "set-cookie" not in r.headers


def test_a_forged_or_foreign_cookie_is_unauthorized(
    client: TestClient, tenant: dict[str, str], platform: Platform
) -> None:
    client.cookies.set(SESSION_COOKIE, key_of(tenant))  # the key itself, not sealed
    r = client.get("/v1/trainings")
    assert r.status_code == 401
    assert "sign in again" in r.json()["detail"]
    # A credential sealed for a manifest is no session.
    client.cookies.set(SESSION_COOKIE, platform.secrets.encrypt(key_of(tenant)))
    assert client.get("/v1/trainings").status_code == 401
    assert client.get("/ui/trainings", follow_redirects=False).status_code == 303


def test_the_admin_key_shows_the_tenants_page(client: TestClient) -> None:
    sign_in(client, ADMIN_KEY)
    assert client.get("/ui/", follow_redirects=False).headers["location"] == "/ui/tenants"
    page = client.get("/ui/tenants")
    assert page.status_code == 200
    assert "Create tenant" in page.text
    # A tenant's page is not the admin's.
    assert client.get("/ui/trainings", follow_redirects=False).headers["location"] == "/ui/"
    created = client.post("/v1/tenants", json={"name": "beta", "plan": "lite"}, headers=SAME_SITE)
    assert created.status_code == 201, created.text
    assert [t["name"] for t in client.get("/v1/tenants").json()["items"]] == ["beta"]


def test_a_tenant_does_not_see_the_tenants_page(client: TestClient, tenant: dict[str, str]) -> None:
    sign_in(client, key_of(tenant))
    assert client.get("/ui/tenants", follow_redirects=False).headers["location"] == "/ui/"
    assert client.get("/v1/tenants").status_code == 403


def test_pages_without_a_session_go_to_sign_in(client: TestClient) -> None:
    for path in ("/ui", "/ui/", "/ui/trainings", "/ui/trainings/x", "/ui/deployments"):
        r = client.get(path, follow_redirects=False)
        assert r.status_code == 303, path
        assert r.headers["location"] == "/ui/sign-in"
    page = client.get("/ui/sign-in")
    assert page.status_code == 200
    assert '<label for="api_key">API key</label>' in page.text
    assert client.get("/ui/static/dashboard.js").status_code == 200
    assert client.get("/ui/vendor/uPlot.iife.min.js").status_code == 200
    assert client.get("/ui/vendor/other.js").status_code == 404
    assert not any(p.startswith("/ui") for p in client.get("/openapi.json").json()["paths"])


@pytest.fixture
def settings_without_assets(platform: Platform, tmp_path: Path) -> Platform:
    """The platform, as if `make ui-assets` never ran."""
    platform.settings.ui_assets_dir = tmp_path / "not-installed"
    return platform


def test_missing_front_end_libraries_are_a_clear_503(
    settings_without_assets: Platform, client: TestClient
) -> None:
    page = client.get("/ui/sign-in")
    assert page.status_code == 503
    assert "make ui-assets" in page.text
    assert "Traceback" not in page.text
    vendor = client.get("/ui/vendor/uPlot.iife.min.js")
    assert vendor.status_code == 503
    assert "make ui-assets" in vendor.text


def test_another_tenants_key_sees_not_its_trainings(client: TestClient) -> None:
    acme = create_tenant(client, "acme")
    other = create_tenant(client, "other")
    created = submit(client, acme).json()
    sign_in(client, key_of(other))
    assert client.get(f"/v1/trainings/{created['id']}").status_code == 404


def test_an_authorization_header_wins_over_the_cookie(client: TestClient) -> None:
    acme = create_tenant(client, "acme")
    other = create_tenant(client, "other")
    mine = submit(client, acme).json()
    sign_in(client, key_of(other))
    assert client.get("/v1/trainings").json()["items"] == []
    listed = client.get("/v1/trainings", headers=acme).json()["items"]
    assert [t["id"] for t in listed] == [mine["id"]]


def test_a_session_ends_after_its_max_age(
    client: TestClient, tenant: dict[str, str], platform: Platform, monkeypatch: pytest.MonkeyPatch
) -> None:
    import time

    import cryptography.fernet

    sealed = sign_in(client, key_of(tenant))[SESSION_COOKIE].value
    client.cookies.clear()
    # The cookie as a copy of it would be sent, past the Max-Age a browser honours.
    cookie = {"Cookie": f"{SESSION_COOKIE}={sealed}"}
    assert client.get("/v1/trainings", headers=cookie).status_code == 200
    later = time.time() + platform.settings.session_max_age + 5
    monkeypatch.setattr(cryptography.fernet.time, "time", lambda: later)
    r = client.get("/v1/trainings", headers=cookie)
    assert r.status_code == 401
    assert "expired" in r.json()["detail"]
    page = client.get("/ui/trainings", headers=cookie, follow_redirects=False)
    assert page.headers["location"] == "/ui/sign-in"


class _Upstream(BaseHTTPRequestHandler):
    """A scoring service that answers every prediction and remembers what it was sent."""

    seen: ClassVar[list[dict[str, str]]] = []

    def do_POST(self) -> None:
        self.rfile.read(int(self.headers.get("content-length", 0)))
        self.seen.append(dict(self.headers.items()))
        body = b'{"predictions": [[1.0]]}'
        self.send_response(200)
        self.send_header("content-type", "application/json")
        self.send_header("content-length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: object) -> None:
        pass


def test_predictions_forwarded_to_a_scoring_service_carry_the_cookies_key(
    settings: Settings, tenant: dict[str, str], platform: Platform
) -> None:
    upstream = ThreadingHTTPServer(("127.0.0.1", 0), _Upstream)
    threading.Thread(target=upstream.serve_forever, daemon=True).start()
    _Upstream.seen.clear()
    try:
        forwarding = Settings(
            **{**settings.model_dump(), "scoring_url": f"http://127.0.0.1:{upstream.server_port}"}
        )
        proxy = Platform.from_settings(forwarding)
        try:
            with TestClient(create_app(platform=proxy)) as api:
                sign_in(api, key_of(tenant))
                url = "/v1/deployments/d1/predictions"
                refused = api.post(url, json={"instances": [[1.0]]})  # no CSRF header
                assert refused.status_code == 403
                assert _Upstream.seen == []
                r = api.post(url, json={"instances": [[1.0]]}, headers=SAME_SITE)
                assert r.status_code == 200, r.text
        finally:
            proxy.close()
    finally:
        upstream.shutdown()
    (sent,) = _Upstream.seen
    assert sent["authorization"] == tenant["Authorization"]
    assert "dlaas_session" not in sent.get("cookie", "")
