"""Bounded use per tenant through the API: queued trainings and deployments above the
plan's limits are refused with 429 naming the limit and the use; max_runtime gets the
plan's default and is refused above its maximum; GET /v1/usage shows the use."""

from __future__ import annotations

from fastapi.testclient import TestClient

from service.db.models import Deployment, utcnow
from service.domain.catalog import DEFAULT_CATALOG
from service.platform import Platform
from tests.conftest import create_tenant, manifest_yaml, submit

LITE = DEFAULT_CATALOG.plans["lite"]
STANDARD = DEFAULT_CATALOG.plans["standard"]


def test_queued_trainings_above_the_plan_are_refused_with_429(client: TestClient) -> None:
    lite = create_tenant(client, "small", "lite")
    for _ in range(LITE.max_queued_trainings):
        assert submit(client, lite).status_code == 201
    r = submit(client, lite)
    assert r.status_code == 429, r.text
    assert r.headers["content-type"] == "application/problem+json"
    problem = r.json()
    n = LITE.max_queued_trainings
    assert f"the lite plan allows {n} queued trainings; you have {n}" in problem["detail"]
    assert problem["errors"][0]["field"] == "max_queued_trainings"
    # Another tenant's queue is its own.
    other = create_tenant(client, "other", "lite")
    assert submit(client, other).status_code == 201
    # Stopping a queued training frees a place.
    first = client.get("/v1/trainings", headers=lite).json()["items"][-1]["id"]
    assert client.post(f"/v1/trainings/{first}/stop", headers=lite).status_code == 200
    assert submit(client, lite).status_code == 201


def test_a_training_without_max_runtime_gets_the_plans_default(
    client: TestClient, tenant: dict[str, str]
) -> None:
    r = submit(client, tenant)
    assert r.status_code == 201, r.text
    assert r.json()["max_runtime"] == STANDARD.default_max_runtime
    shown = client.get(f"/v1/trainings/{r.json()['id']}", headers=tenant).json()
    assert shown["max_runtime"] == STANDARD.default_max_runtime
    r = submit(client, tenant, manifest_yaml(max_runtime=90))
    assert client.get(f"/v1/trainings/{r.json()['id']}", headers=tenant).json()["max_runtime"] == 90


def test_max_runtime_above_the_plans_maximum_is_refused_with_422(client: TestClient) -> None:
    lite = create_tenant(client, "small", "lite")
    r = submit(client, lite, manifest_yaml(max_runtime=LITE.max_max_runtime + 1))
    assert r.status_code == 422, r.text
    errors = r.json()["errors"]
    assert errors == [
        {
            "field": "/max_runtime",
            "message": f"the lite plan allows at most {LITE.max_max_runtime} s; "
            f"got {LITE.max_max_runtime + 1}",
        }
    ]
    assert submit(client, lite, manifest_yaml(max_runtime=LITE.max_max_runtime)).status_code == 201


def _keep_deployments(platform: Platform, tenant_id: str, n: int) -> None:
    with platform.sessions() as session:
        for i in range(n):
            now = utcnow()
            session.add(
                Deployment(
                    id=f"d{i}",
                    tenant_id=tenant_id,
                    training_id="t",
                    name=f"d{i}",
                    status="FAILED",
                    model_key=f"deployments/d{i}/",
                    created_at=now,
                    updated_at=now,
                )
            )
        session.commit()


def test_deployments_above_the_plan_are_refused_with_429(
    client: TestClient, platform: Platform
) -> None:
    lite = create_tenant(client, "small", "lite")
    training_id = submit(client, lite).json()["id"]
    tenant_id = client.get("/v1/usage", headers=lite).json()["tenant_id"]
    _keep_deployments(platform, tenant_id, LITE.max_deployments)
    r = client.post("/v1/deployments", json={"training_id": training_id}, headers=lite)
    assert r.status_code == 429, r.text
    n = LITE.max_deployments
    assert f"the lite plan allows {n} deployments; you have {n}" in r.json()["detail"]
    assert r.json()["errors"][0]["field"] == "max_deployments"
    # Below the limit the same request gets past it (and meets the deployment rule).
    assert client.delete("/v1/deployments/d0", headers=lite).status_code == 204
    r = client.post("/v1/deployments", json={"training_id": training_id}, headers=lite)
    assert r.status_code == 409, r.text


def test_usage_shows_the_use_against_the_plan(client: TestClient, platform: Platform) -> None:
    lite = create_tenant(client, "small", "lite")
    empty = client.get("/v1/usage", headers=lite)
    assert empty.status_code == 200, empty.text
    assert empty.json() == {
        "tenant_id": empty.json()["tenant_id"],
        "plan": "lite",
        "queued_trainings": {"used": 0, "limit": LITE.max_queued_trainings},
        "active_trainings": {"used": 0, "limit": LITE.max_concurrent_trainings},
        "deployments": {"used": 0, "limit": LITE.max_deployments},
        "max_runtime": {"default": LITE.default_max_runtime, "maximum": LITE.max_max_runtime},
    }
    submit(client, lite)
    submit(client, lite)
    _keep_deployments(platform, empty.json()["tenant_id"], 1)
    body = client.get("/v1/usage", headers=lite).json()
    assert body["queued_trainings"]["used"] == 2
    assert body["deployments"]["used"] == 1
    # Another tenant's use is not counted.
    other = create_tenant(client, "other", "standard")
    body = client.get("/v1/usage", headers=other).json()
    assert (body["plan"], body["queued_trainings"]["used"], body["deployments"]["used"]) == (
        "standard",
        0,
        0,
    )
    assert client.get("/v1/usage").status_code == 401
