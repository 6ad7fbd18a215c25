"""Bounded use per tenant through the API: queued trainings and deployments above the
plan's limits are refused with 429 naming the limit and the use; max_runtime gets the
plan's default and is refused above its maximum; GET /v1/usage shows the use."""

from __future__ import annotations

from pathlib import Path
from typing import cast

import pytest
from fastapi.testclient import TestClient

from service.db.models import Deployment, Training, utcnow
from service.domain.catalog import DEFAULT_CATALOG
from service.domain.states import TrainingState
from service.platform import Platform
from service.storage import keys
from service.trainings import record_transition
from tests.conftest import CODE_ZIP, create_tenant, manifest_yaml, submit
from tests.fakes import RecordingBackend
from worker import execution
from worker.backends.base import Backend

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
        "active_nodes": {"used": 0, "limit": LITE.active_nodes_limit},
        "deployments": {"used": 0, "limit": LITE.max_deployments},
        "stored_bytes": {"used": 0, "limit": LITE.max_stored_bytes},
        "max_runtime": {"default": LITE.default_max_runtime, "maximum": LITE.max_max_runtime},
    }
    submit(client, lite)
    submit(client, lite)
    _keep_deployments(platform, empty.json()["tenant_id"], 1)
    body = client.get("/v1/usage", headers=lite).json()
    assert body["queued_trainings"]["used"] == 2
    assert body["deployments"]["used"] == 1
    assert body["stored_bytes"]["used"] == 2 * len(CODE_ZIP)
    # Another tenant's use is not counted.
    other = create_tenant(client, "other", "standard")
    body = client.get("/v1/usage", headers=other).json()
    assert (body["plan"], body["queued_trainings"]["used"], body["deployments"]["used"]) == (
        "standard",
        0,
        0,
    )
    assert client.get("/v1/usage").status_code == 401


# -- stored bytes --------------------------------------------------------------------------


class _NoBackend:
    """A backend that never ran the training's learners (finalize stops, observes and
    cleans up; here there is nothing to)."""

    def stop(self, training_id: str) -> None:
        self.stopped = training_id

    def observe(self, training_id: str) -> None:
        return None

    def cleanup(self, training_id: str) -> None:
        self.cleaned = training_id


def test_stored_bytes_count_code_and_results_and_bound_submissions(
    client: TestClient, platform: Platform, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    lite = create_tenant(client, "small", "lite")
    limit = 3 * len(CODE_ZIP) + 100
    plans = dict(platform.catalog.plans)
    plans["lite"] = plans["lite"].model_copy(update={"max_stored_bytes": limit})
    monkeypatch.setattr(platform, "catalog", platform.catalog.model_copy(update={"plans": plans}))

    first = submit(client, lite).json()["id"]
    # The training ends with 100 bytes of results: the worker records them.
    results = tmp_path / "out.bin"
    results.write_bytes(b"x" * 100)
    platform.store.put_file(keys.result_key(first, "out.bin"), results)
    platform.store.put_file(keys.learner_log_key(keys.results_prefix(first), 1), results)
    execution.finalize(platform, cast(Backend, _NoBackend()), first)
    usage = client.get("/v1/usage", headers=lite).json()["stored_bytes"]
    assert usage == {"used": len(CODE_ZIP) + 200, "limit": limit}

    assert submit(client, lite).status_code == 201  # 2 archives + 200 bytes: under
    r = submit(client, lite)  # a third archive would go over
    assert r.status_code == 429, r.text
    used = 2 * len(CODE_ZIP) + 200
    assert r.json()["errors"][0]["field"] == "max_stored_bytes"
    assert (
        f"the lite plan allows {limit} bytes stored; you have {used} and this adds {len(CODE_ZIP)}"
        in r.json()["detail"]
    )
    assert len(client.get("/v1/trainings", headers=lite).json()["items"]) == 2  # nothing kept
    # Deleting a training frees its bytes.
    assert client.delete(f"/v1/trainings/{first}", headers=lite).status_code == 204
    assert submit(client, lite).status_code == 201


def test_the_learners_get_their_share_of_the_plans_log_bytes(
    client: TestClient, platform: Platform
) -> None:
    lite = create_tenant(client, "small", "lite")
    training_id = submit(client, lite).json()["id"]
    with platform.sessions() as session:
        training = session.get(Training, training_id)
        assert training is not None
        record_transition(training, TrainingState.PENDING)
        session.commit()
    backend = RecordingBackend()
    execution.launch(platform, cast(Backend, backend), training_id)
    [request] = backend.requests
    assert request.max_log_bytes == LITE.max_log_bytes_per_training  # one learner: all of it
