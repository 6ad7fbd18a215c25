"""Request rates at the REST API (service.http.rates, checked by the request gate before a
body is read): a tenant over its plan's requests_per_second gets 429 problem+json with
Retry-After while another tenant is served; a missing or wrong key counts against its
address's budget (DLAAS_AUTH_FAILURES_PER_MINUTE), past which the key is not even looked
up; health endpoints and the dashboard's assets are not counted."""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import pytest
from fastapi.testclient import TestClient

from service.api.app import create_app
from service.http import limits
from service.platform import Platform
from service.settings import Settings
from tests.api.test_ui import sign_in
from tests.conftest import admin_headers, create_tenant, submit

BURST = 3
BUDGET = 4


@pytest.fixture
def rated(settings: Settings) -> Iterator[TestClient]:
    """The API with a lite plan of BURST requests at once (one a minute after that) and a
    budget of BUDGET bad keys a minute per address; refusals are answered at once."""
    update = {"auth_failures_per_minute": BUDGET, "rate_limit_pause_seconds": 0}
    platform = Platform.from_settings(settings.model_copy(update=update))
    lite = platform.catalog.plans["lite"].model_copy(
        update={"requests_per_second": 1 / 60, "request_burst": BURST}
    )
    platform.catalog = platform.catalog.model_copy(
        update={"plans": {**platform.catalog.plans, "lite": lite}}
    )
    try:
        with TestClient(create_app(platform=platform), raise_server_exceptions=False) as c:
            yield c
    finally:
        platform.close()


def assert_too_many(r: Any, field: str, retry_after: int) -> None:
    assert r.status_code == 429, r.text
    assert r.headers["content-type"] == "application/problem+json"
    assert r.headers["Retry-After"] == str(retry_after)
    assert r.json()["errors"][0]["field"] == field


def test_a_tenant_over_its_rate_gets_429_while_another_is_served(rated: TestClient) -> None:
    noisy = create_tenant(rated, "noisy", "lite")
    quiet = create_tenant(rated, "quiet", "standard")
    r = submit(rated, quiet)
    assert r.status_code == 201, r.text
    training = r.json()["id"]
    for _ in range(BURST):
        assert rated.get("/v1/trainings", headers=noisy).status_code == 200
    refused = rated.get("/v1/trainings", headers=noisy)
    assert_too_many(refused, "requests_per_second", 60)
    assert "lite plan allows" in refused.json()["detail"]
    # Refused before its body is read: an upload is answered as small as a GET.
    assert_too_many(submit(rated, noisy), "requests_per_second", 60)
    # The other tenant, and the admin, are served meanwhile.
    for _ in range(10):
        assert rated.get(f"/v1/trainings/{training}", headers=quiet).status_code == 200
    assert rated.get("/v1/tenants", headers=admin_headers()).status_code == 200
    # Health endpoints are not counted.
    assert rated.get("/healthz").status_code == 200


def test_the_dashboard_draws_on_the_same_rate(rated: TestClient) -> None:
    noisy = create_tenant(rated, "noisy", "lite")
    cookie = sign_in(rated, noisy["Authorization"].removeprefix("Bearer "))
    rated.cookies.set("dlaas_session", cookie["dlaas_session"].value)
    for _ in range(BURST):
        assert rated.get("/v1/trainings").status_code == 200
    assert_too_many(rated.get("/v1/trainings"), "requests_per_second", 60)
    assert_too_many(rated.get("/v1/trainings", headers=noisy), "requests_per_second", 60)
    # The dashboard's pages and assets are not counted.
    assert rated.get("/ui/static/dashboard.js").status_code == 200
    assert rated.get("/ui/trainings").status_code == 200


def test_bad_keys_spend_the_address_budget_then_are_not_looked_up(
    rated: TestClient, monkeypatch: pytest.MonkeyPatch
) -> None:
    tenant = create_tenant(rated, "acme", "standard")
    assert rated.get("/v1/trainings", headers=tenant).status_code == 200  # known now
    looked_up = []
    authenticate = limits.authenticate

    def counting(platform: Platform, key: str) -> Any:
        looked_up.append(key)
        return authenticate(platform, key)

    monkeypatch.setattr(limits, "authenticate", counting)
    for i in range(BUDGET - 1):
        r = rated.get("/v1/trainings", headers={"Authorization": f"Bearer guess-{i}"})
        assert r.status_code == 401, r.text
    assert rated.get("/v1/trainings").status_code == 401  # no key at all counts too
    assert len(looked_up) == BUDGET - 1
    # Spent: refused before the key is looked up, with the seconds until one more.
    refused = rated.get("/v1/trainings", headers={"Authorization": "Bearer guess-x"})
    assert_too_many(refused, "DLAAS_AUTH_FAILURES_PER_MINUTE", 15)
    assert_too_many(rated.get("/v1/trainings"), "DLAAS_AUTH_FAILURES_PER_MINUTE", 15)
    assert len(looked_up) == BUDGET - 1
    # Dashboard sign-in spends the same budget.
    r = rated.post(
        "/ui/sign-in", data={"api_key": "guess-y"}, headers={"Origin": "http://testserver"}
    )
    assert r.status_code == 429 and r.headers["Retry-After"] == "15"
    assert len(looked_up) == BUDGET - 1
    # A key the platform knows is still served from that address, as is health; also
    # when the revocations are due to be looked at again (its key is looked up then).
    assert rated.get("/v1/trainings", headers=tenant).status_code == 200
    platform: Platform = rated.app.state.platform  # type: ignore[attr-defined]
    platform.tenant_keys.check_every = 0.0
    assert rated.get("/v1/trainings", headers=tenant).status_code == 200
    assert len(looked_up) == BUDGET
    assert rated.get("/readyz").status_code == 200


def test_wrong_dashboard_sign_ins_spend_the_budget(rated: TestClient) -> None:
    for i in range(BUDGET):
        r = rated.post(
            "/ui/sign-in", data={"api_key": f"guess-{i}"}, headers={"Origin": "http://testserver"}
        )
        assert r.status_code == 401, r.text
    assert_too_many(rated.get("/v1/trainings"), "DLAAS_AUTH_FAILURES_PER_MINUTE", 15)


def test_refusals_are_answered_after_the_pause(settings: Settings) -> None:
    update = {"auth_failures_per_minute": 1, "rate_limit_pause_seconds": 0.5}
    platform = Platform.from_settings(settings.model_copy(update=update))
    try:
        with TestClient(create_app(platform=platform), raise_server_exceptions=False) as c:
            assert c.get("/v1/trainings").status_code == 401  # the budget's one
            started = time.monotonic()
            assert_too_many(c.get("/v1/trainings"), "DLAAS_AUTH_FAILURES_PER_MINUTE", 60)
            assert time.monotonic() - started >= 0.5
    finally:
        platform.close()


def test_every_keyed_operation_documents_the_429(client: TestClient) -> None:
    paths = client.get("/openapi.json").json()["paths"]
    for path in ("/v1/trainings/{training_id}", "/v1/usage", "/v1/deployments"):
        for operation in paths[path].values():
            assert "429" in operation["responses"], (path, operation["operationId"])
    assert "429" not in paths["/healthz"]["get"]["responses"]


def test_forwarded_predictions_are_counted_by_the_scoring_service_alone(
    settings: Settings,
) -> None:
    """With DLAAS_SCORING_URL the API forwards predictions; the scoring service's own gate
    counts them (its rates shared through Redis), so the API does not count them again."""
    update = {"scoring_url": "http://127.0.0.1:9", "rate_limit_pause_seconds": 0}
    platform = Platform.from_settings(settings.model_copy(update=update))
    lite = platform.catalog.plans["lite"].model_copy(
        update={"requests_per_second": 1 / 60, "request_burst": BURST}
    )
    platform.catalog = platform.catalog.model_copy(
        update={"plans": {**platform.catalog.plans, "lite": lite}}
    )
    try:
        with TestClient(create_app(platform=platform), raise_server_exceptions=False) as c:
            noisy = create_tenant(c, "noisy", "lite")
            for _ in range(BURST + 2):
                r = c.post("/v1/deployments/d1/predictions", json={"instances": []}, headers=noisy)
                assert r.status_code != 429, r.text
            for _ in range(BURST):
                assert c.get("/v1/trainings", headers=noisy).status_code == 200
            assert_too_many(c.get("/v1/trainings", headers=noisy), "requests_per_second", 60)
    finally:
        platform.close()
