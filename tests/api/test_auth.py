"""Keys, the admin/tenant split, and tenant isolation."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest
from fastapi.testclient import TestClient

from service.auth import ensure_admin_key, hash_api_key
from service.db.models import ApiKey
from service.platform import Platform
from service.settings import Settings
from tests.conftest import admin_headers, create_tenant, submit


@pytest.mark.parametrize(
    ("method", "path"),
    [
        ("GET", "/v1/trainings"),
        ("POST", "/v1/trainings"),
        ("GET", "/v1/trainings/abc"),
        ("POST", "/v1/trainings/abc/stop"),
        ("DELETE", "/v1/trainings/abc"),
        ("GET", "/v1/tenants"),
        ("POST", "/v1/tenants"),
    ],
)
@pytest.mark.parametrize(
    "authorization", [None, "Bearer wrong-key", "Basic dXNlcjpwYXNz", "Bearer ", "token"]
)
def test_missing_or_wrong_key_is_401(
    client: TestClient, method: str, path: str, authorization: str | None
) -> None:
    headers = {"Authorization": authorization} if authorization is not None else {}
    r = client.request(method, path, headers=headers)
    assert r.status_code == 401
    assert r.headers["content-type"] == "application/problem+json"
    assert r.headers["www-authenticate"] == "Bearer"


def test_admin_endpoints_refuse_tenant_keys(client: TestClient, tenant: dict[str, str]) -> None:
    assert client.get("/v1/tenants", headers=tenant).status_code == 403
    r = client.post("/v1/tenants", json={"name": "evil", "plan": "standard"}, headers=tenant)
    assert r.status_code == 403
    assert "admin" in r.json()["detail"]


def test_admin_key_is_not_a_tenant(client: TestClient) -> None:
    r = client.get("/v1/trainings", headers=admin_headers())
    assert r.status_code == 403
    assert "tenant" in r.json()["detail"]


def test_tenant_key_is_shown_once_and_stored_hashed(client: TestClient, platform: Platform) -> None:
    r = client.post("/v1/tenants", json={"name": "acme", "plan": "lite"}, headers=admin_headers())
    assert r.status_code == 201
    body = r.json()
    assert set(body) == {"id", "name", "plan", "api_key", "created_at"}
    listed = client.get("/v1/tenants", headers=admin_headers()).json()["items"]
    assert [t["name"] for t in listed] == ["acme"] and "api_key" not in listed[0]
    with platform.sessions() as s:
        stored = s.query(ApiKey).one()
    assert stored.key_hash == hash_api_key(body["api_key"]) != body["api_key"]


@pytest.mark.parametrize(
    ("body", "status", "field"),
    [
        ({"name": "x", "plan": "gold"}, 422, "plan"),
        ({"name": "", "plan": "lite"}, 422, "name"),
        ({"name": "has space", "plan": "lite"}, 422, "name"),
        ({"plan": "lite"}, 422, "name"),
    ],
)
def test_bad_tenant_requests(
    client: TestClient, body: dict[str, str], status: int, field: str
) -> None:
    r = client.post("/v1/tenants", json=body, headers=admin_headers())
    assert r.status_code == status
    assert field in [e["field"] for e in r.json()["errors"]]


def test_duplicate_tenant_is_409(client: TestClient) -> None:
    create_tenant(client, "acme")
    r = client.post("/v1/tenants", json={"name": "acme", "plan": "lite"}, headers=admin_headers())
    assert r.status_code == 409


def test_other_tenants_trainings_are_invisible(client: TestClient) -> None:
    alice = create_tenant(client, "alice")
    bob = create_tenant(client, "bob")
    training = submit(client, alice).json()["id"]
    submit(client, bob)
    for method, path in [
        ("GET", f"/v1/trainings/{training}"),
        ("POST", f"/v1/trainings/{training}/stop"),
        ("DELETE", f"/v1/trainings/{training}"),
    ]:
        r = client.request(method, path, headers=bob)
        assert r.status_code == 404, (method, r.text)
        assert r.headers["content-type"] == "application/problem+json"
    bobs = client.get("/v1/trainings", headers=bob).json()["items"]
    assert training not in [t["id"] for t in bobs] and len(bobs) == 1
    # Alice's training is untouched by Bob's attempts.
    assert client.get(f"/v1/trainings/{training}", headers=alice).json()["status"] == "QUEUED"


def test_admin_key_is_generated_once_with_mode_0600(tmp_path: Path) -> None:
    settings = Settings(home=tmp_path, admin_api_key=None)
    first = ensure_admin_key(settings)
    path = tmp_path / "admin_api_key"
    assert stat.S_IMODE(os.stat(path).st_mode) == 0o600
    assert ensure_admin_key(settings) == first and len(first) > 30
    assert ensure_admin_key(Settings(home=tmp_path, admin_api_key="given")) == "given"
