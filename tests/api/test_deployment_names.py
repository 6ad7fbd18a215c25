"""A deployment's name is unique per tenant (TensorFlow Serving's paths and the gRPC API
address a model by it), even when two requests ask for it at once.

The name is checked, then the row inserted; another request can insert the same name in
between. The database's unique index (`uq_deployments_tenant_name`) refuses the second
insert, and the request that lost is checked again: an asked-for name is the usual 409
naming /name, a default name takes the next free suffix. The race is made here by letting
the check miss the row once (`stale_check`), as it would if the other request had
inserted it just after the check."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any, Protocol

import pytest
from fastapi.testclient import TestClient
from sqlalchemy import select

from service import deployments
from service.db.models import Deployment
from service.platform import Platform
from tests.api.test_deployments import completed_training, saved_models
from tests.conftest import create_tenant

__all__ = ["saved_models"]


def stale_check(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The next name check of a deployment's insert misses every row, once; returns the
    names it missed."""
    real: Callable[..., Any] = deployments.repository.deployment_named
    missed: list[str] = []

    def named(session: Any, tenant_id: str, name: str) -> Any:
        if not missed:
            missed.append(name)
            return None
        return real(session, tenant_id, name)

    monkeypatch.setattr(deployments.repository, "deployment_named", named)
    return missed


class Deploy(Protocol):
    def __call__(self, name: str | None, headers: dict[str, str] | None = None) -> Any: ...


@pytest.fixture
def deploy(
    client: TestClient, tenant: dict[str, str], platform: Platform, saved_models: dict[str, Path]
) -> Deploy:
    """POST /v1/deployments of a new COMPLETED training, with the name given (or none), as
    `tenant` unless other headers are given."""

    def post(name: str | None, headers: dict[str, str] | None = None) -> Any:
        caller = headers or tenant
        training_id = completed_training(client, caller, platform, saved_models["linear"])
        body = {"training_id": training_id} | ({"name": name} if name else {})
        return client.post("/v1/deployments", json=body, headers=caller)

    return post


def test_deployment_names_are_unique_per_tenant(deploy: Deploy, client: TestClient) -> None:
    first = deploy("scorer")
    assert first.status_code == 202, first.text
    taken = deploy("scorer")
    assert taken.status_code == 409, taken.text
    assert taken.json()["errors"][0]["field"] == "/name"
    assert "scorer" in taken.json()["detail"]
    # Another tenant may use the name; a default name (the training's) is made unique.
    r = deploy("scorer", create_tenant(client, "other"))
    assert r.status_code == 202, r.text
    names = [deploy(None).json()["name"] for _ in range(2)]
    assert names[1] == f"{names[0]}-2"


def names(platform: Platform) -> list[str]:
    with platform.sessions() as session:
        return list(session.scalars(select(Deployment.name).order_by(Deployment.created_at)))


def test_a_name_taken_between_the_check_and_the_insert_is_a_conflict(
    deploy: Deploy, platform: Platform, monkeypatch: pytest.MonkeyPatch
) -> None:
    first = deploy("scorer")
    assert first.status_code == 202, first.text
    missed = stale_check(monkeypatch)
    second = deploy("scorer")
    assert missed == ["scorer"]  # the check did miss the first one
    assert second.status_code == 409, second.text
    assert second.headers["content-type"] == "application/problem+json"
    assert second.json()["errors"][0]["field"] == "/name"
    assert "scorer" in second.json()["detail"]
    assert names(platform) == ["scorer"]  # nothing of the refused one is left


def test_a_default_name_lost_to_another_request_takes_the_next_suffix(
    deploy: Deploy, platform: Platform, monkeypatch: pytest.MonkeyPatch
) -> None:
    first = deploy(None)
    assert first.status_code == 202, first.text
    default = first.json()["name"]
    missed = stale_check(monkeypatch)
    second = deploy(None)
    assert missed == [default]
    assert second.status_code == 202, second.text
    assert second.json()["name"] == f"{default}-2"
    assert names(platform) == [default, f"{default}-2"]
    with platform.sessions() as session:  # the retried insert kept its versions
        row = session.get(Deployment, second.json()["id"])
        assert row is not None
    assert [v["version"] for v in second.json()["versions"]] == [1]
