"""The request gate (service/http/limits.py): the key, then each route's body cap, before a
body is read. Through the app; the real-server checks (a body refused before it is sent,
the server's memory) are in tests/api/test_live_server.py."""

from __future__ import annotations

import io
import json
import zipfile
from collections.abc import Iterator

import pytest
from fastapi.testclient import TestClient

from service.http.health import PUBLIC_PATHS, router
from service.platform import Platform
from service.scoring.app import create_scoring_app
from service.settings import Settings
from tests.conftest import CODE_ZIP, admin_headers, submit

JSON_CAP = 64 * 1024
PREDICTION_CAP = 256 * 1024


@pytest.fixture
def settings(settings: Settings) -> Settings:
    # Upload cap 2 MiB (tests/conftest.py) > prediction cap > JSON cap.
    return settings.model_copy(
        update={"max_json_bytes": JSON_CAP, "max_prediction_bytes": PREDICTION_CAP}
    )


def _json_body(size: int) -> bytes:
    """A JSON document of `size` bytes (white space makes up the size)."""
    head = b'{"training_id": "x"'
    return head + b" " * (size - len(head) - 1) + b"}"


def test_public_paths_need_no_key(client: TestClient) -> None:
    assert set(PUBLIC_PATHS) == {getattr(route, "path", None) for route in router.routes}
    for path in [*PUBLIC_PATHS, "/docs", "/openapi.json", "/redoc"]:
        assert client.get(path).status_code == 200, path


def test_a_body_without_a_valid_key_is_refused_before_it_is_read(
    client: TestClient, tenant: dict[str, str]
) -> None:
    body = _json_body(JSON_CAP * 4)
    for headers in ({}, {"Authorization": "Bearer not-a-key"}, {"Authorization": "Basic eA=="}):
        r = client.post(
            "/v1/deployments",
            content=body,
            headers={**headers, "Content-Type": "application/json"},
        )
        # 401 even though the body is also over the cap: the key comes first.
        assert r.status_code == 401, r.text
        assert r.headers["content-type"] == "application/problem+json"
        assert r.headers["www-authenticate"] == "Bearer"
        assert r.headers["connection"] == "close"


def test_an_authenticated_json_body_over_the_cap_is_413_naming_it(
    client: TestClient, tenant: dict[str, str]
) -> None:
    tenant = {**tenant, "Content-Type": "application/json"}
    r = client.post("/v1/deployments", content=_json_body(JSON_CAP + 1), headers=tenant)
    assert r.status_code == 413
    assert r.headers["content-type"] == "application/problem+json"
    detail = r.json()["detail"]
    assert f"limit of {JSON_CAP} bytes" in detail and "DLAAS_MAX_JSON_BYTES" in detail
    # At the cap it is read (and refused for what it says: no such training).
    assert (
        client.post("/v1/deployments", content=_json_body(JSON_CAP), headers=tenant).status_code
        == 404
    )


def test_a_chunked_body_is_cut_at_the_cap(client: TestClient, tenant: dict[str, str]) -> None:
    sent = 0

    def chunks() -> Iterator[bytes]:
        nonlocal sent
        body = _json_body(JSON_CAP * 8)
        for i in range(0, len(body), 4096):
            sent += 4096
            yield body[i : i + 4096]

    r = client.post(
        "/v1/deployments",
        content=chunks(),
        headers={**tenant, "Content-Type": "application/json"},
    )
    assert r.status_code == 413
    assert "DLAAS_MAX_JSON_BYTES" in r.json()["detail"]


def test_each_route_has_its_own_cap(client: TestClient, tenant: dict[str, str]) -> None:
    # A training upload above the JSON cap (and under the upload cap) is accepted.
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w", zipfile.ZIP_STORED) as z:
        z.writestr("train.py", "print('hello')\n")
        z.writestr("data.txt", "d" * (JSON_CAP * 2))
    assert len(buf.getvalue()) > JSON_CAP
    assert submit(client, tenant, code=buf.getvalue()).status_code == 201
    # Predictions: up to their own cap the body gets to the route (no such deployment),
    # above it a 413 naming the prediction cap.
    url = "/v1/deployments/nosuch/predictions"
    payload = json.dumps({"instances": [[0.5] * (JSON_CAP // 4)]}).encode()
    assert JSON_CAP < len(payload) < PREDICTION_CAP
    assert client.post(url, content=payload, headers=tenant).status_code == 404
    big_payload = json.dumps({"instances": [[0.5] * PREDICTION_CAP]}).encode()
    r = client.post(url, content=big_payload, headers=tenant)
    assert r.status_code == 413
    assert "DLAAS_MAX_PREDICTION_BYTES" in r.json()["detail"]


def test_admin_and_tenant_keys_pass_the_gate(client: TestClient, tenant: dict[str, str]) -> None:
    r = client.post("/v1/tenants", json={"name": "beta", "plan": "lite"}, headers=admin_headers())
    assert r.status_code == 201
    # The route still decides what a key may do.
    assert (
        client.post("/v1/tenants", json={"name": "x", "plan": "lite"}, headers=tenant).status_code
        == 403
    )
    assert submit(client, tenant, code=CODE_ZIP).status_code == 201


def test_unknown_paths_are_404_with_or_without_a_key(client: TestClient) -> None:
    assert client.post("/v1/nothing", content=b"x" * 10).status_code == 404
    assert client.get("/v1/nothing", headers=admin_headers()).status_code == 404


def test_the_scoring_app_has_the_same_gate(platform: Platform, tenant: dict[str, str]) -> None:
    with TestClient(create_scoring_app(platform=platform), raise_server_exceptions=False) as c:
        assert c.get("/healthz").status_code == 200
        assert c.get("/readyz").status_code == 200
        url = "/v1/deployments/nosuch/predictions"
        r = c.post(url, content=b'{"instances": [[1.0]]}')
        assert r.status_code == 401
        assert r.headers["content-type"] == "application/problem+json"
        assert c.post(url, content=b'{"instances": [[1.0]]}', headers=tenant).status_code == 404
        r = c.post(url, content=b"[" + b"1," * PREDICTION_CAP + b"1]", headers=tenant)
        assert r.status_code == 413


def test_a_prediction_the_database_cannot_serve_is_a_503_problem(
    client: TestClient, tenant: dict[str, str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The predictions fast path answers ahead of the app's handlers: a database down while
    it looks up the deployment is its 503 too, never a 500."""
    from sqlalchemy.exc import OperationalError

    import service.scoring.service as scoring_service

    def down(*args: object, **kwargs: object) -> object:
        raise OperationalError("SELECT", {}, Exception("the database system is shutting down"))

    monkeypatch.setattr(scoring_service, "scoring_target", down)
    r = client.post("/v1/deployments/d1/predictions", json={"instances": [[1.0]]}, headers=tenant)
    assert r.status_code == 503, r.text
    assert r.headers["content-type"] == "application/problem+json"
    assert r.headers["retry-after"] == "5"
    assert "the database is unavailable" in r.json()["detail"]
