"""The scoring service's reconcile pass (service.scoring.service.ScoringService.reconcile)
against the database's deployments, with its model cache and its jobs recorded: what it
keeps loaded, what it unloads, what it schedules."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from service.db.models import Deployment, DeploymentVersion, Tenant
from service.domain.deployments import DeploymentState
from service.domain.versions import VersionState
from service.platform import Platform
from service.scoring.service import ScoringService

ModelKey = tuple[str, int]


class Cache:
    """The model cache's surface that reconcile uses: what is loaded, and what it forgets."""

    def __init__(self, loaded: set[ModelKey]) -> None:
        self.loaded = set(loaded)
        self.forgotten: list[ModelKey] = []

    def cached_ids(self) -> list[ModelKey]:
        return sorted(self.loaded)

    def forget(self, deployment_id: str, version: int | None = None) -> None:
        assert version is not None
        self.loaded.discard((deployment_id, version))
        self.forgotten.append((deployment_id, version))


def deployment(status: str, versions: dict[int, str]) -> tuple[Deployment, list[Any]]:
    rows: list[Any] = [
        DeploymentVersion(
            deployment_id="d1",
            version=n,
            training_id="t1",
            source_key="",
            model_key=f"deployments/d1/{n}/",
            state=state,
        )
        for n, state in versions.items()
    ]
    return (
        Deployment(
            id="d1", tenant_id="t", training_id="t1", name="d", status=status, model_key="k"
        ),
        rows,
    )


def reconciled(
    platform: Platform, status: str, versions: dict[int, str], loaded: set[ModelKey]
) -> tuple[Cache, list[tuple[ModelKey, str]]]:
    platform.migrate()
    with platform.sessions() as session:
        session.add(Tenant(id="t", name="acme", plan="standard"))
        session.flush()
        d, rows = deployment(status, versions)
        session.add(d)
        session.flush()
        session.add_all(rows)
        session.commit()
    scoring = ScoringService(platform)
    cache = Cache(loaded)
    scoring.cache = cache  # type: ignore[assignment]
    scheduled: list[tuple[ModelKey, str]] = []

    def schedule(key: ModelKey, job: Callable[..., Any], *args: Any) -> None:
        scheduled.append((key, job.__name__))

    scoring._schedule = schedule  # type: ignore[method-assign]
    scoring.reconcile()
    return cache, scheduled


def test_a_version_loaded_while_its_deployment_is_deploying_stays_loaded(
    platform: Platform,
) -> None:
    """Version 1 loaded (READY) while version 2 still loads: the deployment is DEPLOYING,
    and version 1's model process and local copy stay. Unloading it raced with the first
    requests once the deployment was READY: the local copy was being deleted while a
    request started the model again ("bwrap: Can't find source path")."""
    cache, scheduled = reconciled(
        platform,
        DeploymentState.DEPLOYING,
        {1: VersionState.READY, 2: VersionState.DEPLOYING},
        {("d1", 1), ("gone", 1)},
    )
    assert cache.forgotten == [("gone", 1)]  # a deployment no longer there is unloaded
    assert (("d1", 2), "deploy_version") in scheduled
    assert (("d1", 1), "_preload") in scheduled


def test_the_versions_of_a_failed_deployment_are_unloaded(platform: Platform) -> None:
    cache, _ = reconciled(platform, DeploymentState.FAILED, {1: VersionState.FAILED}, {("d1", 1)})
    assert cache.forgotten == [("d1", 1)]
