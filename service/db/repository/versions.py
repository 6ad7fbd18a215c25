"""A deployment's versions and labels: locking the deployment while they change, reading
them (one deployment's, or a page's grouped), the versions scoring processes load and
serve, recording how loading ended, and moving or deleting labels."""

from __future__ import annotations

from collections.abc import Collection, Sequence
from typing import Any, TypeVar

from sqlalchemy import select, update
from sqlalchemy.orm import Session

from service.db.models import Deployment, DeploymentLabel, DeploymentVersion, utcnow
from service.domain.deployments import DeploymentState
from service.domain.versions import VersionState


def lock_deployment(session: Session, deployment_id: str) -> Deployment | None:
    """The deployment, its row locked until the transaction ends (on PostgreSQL), so that
    two requests changing its versions or labels at once take turns."""
    stmt = select(Deployment).where(Deployment.id == deployment_id).with_for_update()
    return session.scalars(stmt).first()


def deployment_versions(session: Session, deployment_id: str) -> Sequence[DeploymentVersion]:
    stmt = (
        select(DeploymentVersion)
        .where(DeploymentVersion.deployment_id == deployment_id)
        .order_by(DeploymentVersion.version)
    )
    return session.scalars(stmt).all()


def deployment_labels(session: Session, deployment_id: str) -> Sequence[DeploymentLabel]:
    stmt = (
        select(DeploymentLabel)
        .where(DeploymentLabel.deployment_id == deployment_id)
        .order_by(DeploymentLabel.label)
    )
    return session.scalars(stmt).all()


_Row = TypeVar("_Row", DeploymentVersion, DeploymentLabel)


def versions_of(
    session: Session, deployment_ids: Collection[str]
) -> dict[str, list[DeploymentVersion]]:
    """Each deployment's versions, by number (one query for a page of deployments)."""
    return _by_deployment(session, DeploymentVersion, deployment_ids, DeploymentVersion.version)


def labels_of(
    session: Session, deployment_ids: Collection[str]
) -> dict[str, list[DeploymentLabel]]:
    """Each deployment's labels, by name (one query for a page of deployments)."""
    return _by_deployment(session, DeploymentLabel, deployment_ids, DeploymentLabel.label)


def _by_deployment(
    session: Session, model: type[_Row], deployment_ids: Collection[str], order: Any
) -> dict[str, list[_Row]]:
    """The rows of `model` (a table keyed by deployment_id) of each deployment, in `order`."""
    found: dict[str, list[_Row]] = {d: [] for d in deployment_ids}
    if not deployment_ids:
        return found
    column = model.deployment_id
    stmt = select(model).where(column.in_(list(deployment_ids))).order_by(column, order)
    for row in session.scalars(stmt):
        found[row.deployment_id].append(row)
    return found


def deploying_versions(session: Session) -> Sequence[DeploymentVersion]:
    """Versions to load: DEPLOYING, of deployments being deployed or serving."""
    stmt = (
        select(DeploymentVersion)
        .join(Deployment, Deployment.id == DeploymentVersion.deployment_id)
        .where(
            DeploymentVersion.state == VersionState.DEPLOYING,
            Deployment.status.in_([DeploymentState.DEPLOYING, DeploymentState.READY]),
        )
        .order_by(DeploymentVersion.created_at)
    )
    return session.scalars(stmt).all()


def serving_versions(session: Session) -> Sequence[DeploymentVersion]:
    """The loaded versions of READY deployments, and of DEPLOYING ones whose other first
    versions are still loading: what scoring processes keep loaded. A version loaded
    before its deployment is settled is kept: unloading it then (and deleting its local
    copy) raced with the requests that came once the deployment was READY."""
    stmt = (
        select(DeploymentVersion)
        .join(Deployment, Deployment.id == DeploymentVersion.deployment_id)
        .where(
            DeploymentVersion.state == VersionState.READY,
            Deployment.status.in_((DeploymentState.READY, DeploymentState.DEPLOYING)),
        )
        .order_by(DeploymentVersion.created_at)
    )
    return session.scalars(stmt).all()


def deployment_version(
    session: Session, deployment_id: str, version: int
) -> DeploymentVersion | None:
    return session.get(DeploymentVersion, (deployment_id, version))


def finish_version(
    session: Session,
    deployment_id: str,
    version: int,
    *,
    state: str,
    message: str | None,
    signatures: dict[str, Any] | None,
) -> bool:
    """Record how loading a version ended, if it is still DEPLOYING (the first scoring
    process to finish records it). Returns whether this call recorded it."""
    now = utcnow()
    stmt = (
        update(DeploymentVersion)
        .where(
            DeploymentVersion.deployment_id == deployment_id,
            DeploymentVersion.version == version,
            DeploymentVersion.state == VersionState.DEPLOYING,
        )
        .values(
            state=state,
            status_message=message,
            signatures=signatures,
            updated_at=now,
            loaded_at=now if state == VersionState.READY else None,
        )
    )
    result = session.execute(stmt)
    return bool(getattr(result, "rowcount", 0))


def note_version(session: Session, deployment_id: str, version: int, message: str) -> None:
    """Set a READY version's status_message (what happened to its model process)."""
    session.execute(
        update(DeploymentVersion)
        .where(
            DeploymentVersion.deployment_id == deployment_id,
            DeploymentVersion.version == version,
            DeploymentVersion.state == VersionState.READY,
        )
        .values(status_message=message, updated_at=utcnow())
    )


def set_label(session: Session, deployment_id: str, label: str, version: int) -> DeploymentLabel:
    """Point the label at the version (created, or moved)."""
    row = session.get(DeploymentLabel, (deployment_id, label))
    if row is None:
        row = DeploymentLabel(deployment_id=deployment_id, label=label, version=version)
        session.add(row)
    else:
        row.version = version
        row.updated_at = utcnow()
    session.flush()
    return row


def delete_label(session: Session, deployment_id: str, label: str) -> bool:
    row = session.get(DeploymentLabel, (deployment_id, label))
    if row is None:
        return False
    session.delete(row)
    session.flush()
    return True
