"""Keys, the admin/tenant split, and tenant isolation."""

from __future__ import annotations

import os
import stat
import time
from pathlib import Path

import pytest
from fastapi.testclient import TestClient

from service import tenants
from service.api.app import create_app
from service.auth import TenantRef, ensure_admin_key, hash_api_key
from service.db import repository
from service.db.models import ApiKey
from service.platform import KeyCache, Platform
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
        ("GET", "/v1/tenants/abc/keys"),
        ("POST", "/v1/tenants/abc/keys"),
        ("DELETE", "/v1/tenants/abc/keys/k1"),
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


# -- API keys: issue, list, revoke, rotate -------------------------------------------------


def _new_tenant(client: TestClient, name: str) -> tuple[str, str]:
    """A tenant's id and its first key."""
    r = client.post("/v1/tenants", json={"name": name, "plan": "lite"}, headers=admin_headers())
    assert r.status_code == 201, r.text
    return r.json()["id"], r.json()["api_key"]


def _bearer(key: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {key}"}


def test_the_admin_issues_lists_and_revokes_a_tenants_keys(client: TestClient) -> None:
    tenant_id, first = _new_tenant(client, "acme")
    r = client.post(f"/v1/tenants/{tenant_id}/keys", headers=admin_headers())
    assert r.status_code == 201, r.text
    issued = r.json()
    assert set(issued) == {"id", "prefix", "created", "last_used", "revoked", "api_key"}
    second = issued["api_key"]
    assert second.startswith(issued["prefix"]) and len(issued["prefix"]) == 12 < len(second)
    assert issued["last_used"] is None and issued["revoked"] is None
    for key in (first, second):  # both work
        assert client.get("/v1/trainings", headers=_bearer(key)).status_code == 200

    listed = client.get(f"/v1/tenants/{tenant_id}/keys", headers=admin_headers()).json()["items"]
    assert [k["id"] for k in listed][1] == issued["id"] and len(listed) == 2
    assert all(set(k) == {"id", "prefix", "created", "last_used", "revoked"} for k in listed)
    assert [k["prefix"] for k in listed] == [first[:12], second[:12]]
    assert listed[0]["last_used"] is not None  # it authenticated a request just now

    r = client.delete(f"/v1/tenants/{tenant_id}/keys/{listed[0]['id']}", headers=admin_headers())
    assert r.status_code == 204 and r.content == b""
    # Refused at once (this process revoked it; its cache had the key).
    r = client.get("/v1/trainings", headers=_bearer(first))
    assert r.status_code == 401 and r.headers["content-type"] == "application/problem+json"
    assert client.get("/v1/trainings", headers=_bearer(second)).status_code == 200
    # The row stays, marked revoked; revoking again changes nothing.
    listed = client.get(f"/v1/tenants/{tenant_id}/keys", headers=admin_headers()).json()["items"]
    revoked_at = listed[0]["revoked"]
    assert revoked_at is not None and listed[1]["revoked"] is None
    r = client.delete(f"/v1/tenants/{tenant_id}/keys/{listed[0]['id']}", headers=admin_headers())
    assert r.status_code == 204
    again = client.get(f"/v1/tenants/{tenant_id}/keys", headers=admin_headers()).json()["items"]
    assert again[0]["revoked"] == revoked_at


def test_a_tenant_rotates_its_own_key(client: TestClient) -> None:
    tenant_id, old = _new_tenant(client, "acme")
    r = client.post(f"/v1/tenants/{tenant_id}/keys", headers=_bearer(old))
    assert r.status_code == 201, r.text
    new = r.json()["api_key"]
    keys = client.get(f"/v1/tenants/{tenant_id}/keys", headers=_bearer(new)).json()["items"]
    old_id = next(k["id"] for k in keys if old.startswith(k["prefix"]))
    r = client.delete(f"/v1/tenants/{tenant_id}/keys/{old_id}", headers=_bearer(new))
    assert r.status_code == 204
    assert client.get("/v1/trainings", headers=_bearer(old)).status_code == 401
    assert client.get("/v1/trainings", headers=_bearer(new)).status_code == 200
    # A tenant still manages no tenants.
    assert client.get("/v1/tenants", headers=_bearer(new)).status_code == 403


def test_a_tenant_cannot_see_or_touch_another_tenants_keys(client: TestClient) -> None:
    alice_id, alice = _new_tenant(client, "alice")
    bob_id, bob = _new_tenant(client, "bob")
    bobs_key_id = client.get(f"/v1/tenants/{bob_id}/keys", headers=_bearer(bob)).json()["items"][0][
        "id"
    ]
    for method, path in [
        ("GET", f"/v1/tenants/{bob_id}/keys"),
        ("POST", f"/v1/tenants/{bob_id}/keys"),
        ("DELETE", f"/v1/tenants/{bob_id}/keys/{bobs_key_id}"),
        # Bob's key under Alice's own tenant is no key of hers.
        ("DELETE", f"/v1/tenants/{alice_id}/keys/{bobs_key_id}"),
        ("DELETE", f"/v1/tenants/{alice_id}/keys/nosuchkey"),
    ]:
        r = client.request(method, path, headers=_bearer(alice))
        assert r.status_code == 404, (method, path, r.text)
        assert r.headers["content-type"] == "application/problem+json"
    # Bob kept his one key, and it works.
    bobs = client.get(f"/v1/tenants/{bob_id}/keys", headers=admin_headers()).json()["items"]
    assert len(bobs) == 1 and bobs[0]["revoked"] is None
    assert client.get("/v1/trainings", headers=_bearer(bob)).status_code == 200
    # The admin gets 404 for what does not exist.
    assert client.get("/v1/tenants/nosuch/keys", headers=admin_headers()).status_code == 404
    assert client.post("/v1/tenants/nosuch/keys", headers=admin_headers()).status_code == 404
    r = client.delete(f"/v1/tenants/{bob_id}/keys/nosuchkey", headers=admin_headers())
    assert r.status_code == 404 and "nosuchkey" in r.json()["detail"]


def test_a_tenant_holds_a_bounded_number_of_valid_keys(client: TestClient) -> None:
    tenant_id, _ = _new_tenant(client, "acme")
    for _ in range(tenants.MAX_ACTIVE_KEYS - 1):
        assert client.post(f"/v1/tenants/{tenant_id}/keys", headers=admin_headers()).is_success
    r = client.post(f"/v1/tenants/{tenant_id}/keys", headers=admin_headers())
    assert r.status_code == 409 and "revoke one" in r.json()["detail"]
    first = client.get(f"/v1/tenants/{tenant_id}/keys", headers=admin_headers()).json()["items"][0]
    client.delete(f"/v1/tenants/{tenant_id}/keys/{first['id']}", headers=admin_headers())
    assert client.post(f"/v1/tenants/{tenant_id}/keys", headers=admin_headers()).status_code == 201


def test_a_key_revoked_through_another_process_is_refused_within_a_second(
    settings: Settings,
) -> None:
    """Two platforms on one database, as two API processes: B remembers a key, A revokes
    it, and B refuses it within KeyCache.check_every (the in-process form of
    tests/integration/test_key_revocation.py)."""
    a, b = Platform.from_settings(settings), Platform.from_settings(settings)
    try:
        with (
            TestClient(create_app(platform=a)) as api_a,
            TestClient(create_app(platform=b)) as api_b,
        ):
            tenant_id, key = _new_tenant(api_a, "acme")
            assert api_b.get("/v1/trainings", headers=_bearer(key)).status_code == 200
            key_id = api_a.get(f"/v1/tenants/{tenant_id}/keys", headers=admin_headers()).json()[
                "items"
            ][0]["id"]
            r = api_a.delete(f"/v1/tenants/{tenant_id}/keys/{key_id}", headers=admin_headers())
            assert r.status_code == 204
            revoked = time.monotonic()
            while (status := api_b.get("/v1/trainings", headers=_bearer(key)).status_code) == 200:
                assert time.monotonic() - revoked < 1.5, "B still accepts the revoked key"
                time.sleep(0.05)
            assert status == 401
    finally:
        a.close()
        b.close()


def test_revocations_are_looked_up_at_most_once_a_second() -> None:
    cache = KeyCache(ttl=30.0, check_every=0.3)
    reads: list[int] = []
    epoch = 0

    def read() -> int:
        reads.append(epoch)
        return epoch

    ref = TenantRef("t1", "acme", "lite")
    assert cache.get("h") is None  # never looked: ask the database
    cache.refresh(read)
    cache.put("h", ref, cache.generation)
    for _ in range(100):
        cache.refresh(read)
        assert cache.get("h") == ref
    assert len(reads) == 1
    time.sleep(0.35)
    assert cache.get("h") is None  # the look is stale: refresh first
    cache.refresh(read)
    assert cache.get("h") == ref and len(reads) == 2  # the counter did not move
    epoch = 1
    time.sleep(0.35)
    generation = cache.generation  # a lookup that started before the revocation was seen
    cache.refresh(read)
    assert cache.get("h") is None and len(reads) == 3
    cache.put("h", ref, generation)  # ...is not remembered
    assert cache.get("h") is None
    cache.put("h", ref, cache.generation)
    assert cache.get("h") == ref


def test_authenticating_from_the_cache_writes_nothing(
    client: TestClient, platform: Platform, monkeypatch: pytest.MonkeyPatch
) -> None:
    _, key = _new_tenant(client, "acme")
    writes: list[str] = []
    real = repository.touch_key
    monkeypatch.setattr(
        repository, "touch_key", lambda *a, **kw: (writes.append(a[1]), real(*a, **kw))
    )
    for _ in range(20):
        assert client.get("/v1/trainings", headers=_bearer(key)).status_code == 200
    assert len(writes) == 1
