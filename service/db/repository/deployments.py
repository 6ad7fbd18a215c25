"""Deployments: reading them, and recording how deploying ended and what their model
process says."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from sqlalchemy import select, update
from sqlalchemy.orm import Session

from service.db.models import Deployment, utcnow
from service.domain.deployments import DeploymentState


def deployment_by_id(session: Session, deployment_id: str) -> Deployment | None:
    """Any tenant's deployment (the scoring service's view; the API asks with
    `get_deployment`, which checks the owner)."""
    return session.get(Deployment, deployment_id)


def get_deployment(session: Session, tenant_id: str, deployment_id: str) -> Deployment | None:
    stmt = select(Deployment).where(
        Deployment.id == deployment_id, Deployment.tenant_id == tenant_id
    )
    return session.scalars(stmt).first()


def deployment_named(session: Session, tenant_id: str, name: str) -> Deployment | None:
    """The tenant's deployment called `name` (names are unique per tenant)."""
    stmt = select(Deployment).where(Deployment.tenant_id == tenant_id, Deployment.name == name)
    return session.scalars(stmt.order_by(Deployment.created_at)).first()


def list_deployments(session: Session, tenant_id: str) -> Sequence[Deployment]:
    """The tenant's deployments, newest first."""
    stmt = (
        select(Deployment)
        .where(Deployment.tenant_id == tenant_id)
        .order_by(Deployment.created_at.desc(), Deployment.id.desc())
    )
    return session.scalars(stmt).all()


def deployments_in_status(session: Session, status: str) -> Sequence[Deployment]:
    stmt = select(Deployment).where(Deployment.status == status).order_by(Deployment.created_at)
    return session.scalars(stmt).all()


def finish_deploying(
    session: Session,
    deployment_id: str,
    *,
    status: str,
    message: str | None,
    signatures: dict[str, Any] | None,
) -> bool:
    """Record how deploying ended, if the deployment is still DEPLOYING (several scoring
    processes may load the same model; the first to finish records it). Returns whether
    this call recorded it."""
    now = utcnow()
    stmt = (
        update(Deployment)
        .where(Deployment.id == deployment_id, Deployment.status == DeploymentState.DEPLOYING)
        .values(
            status=status,
            status_message=message,
            signatures=signatures,
            updated_at=now,
            ready_at=now if status == DeploymentState.READY else None,
        )
    )
    result = session.execute(stmt)
    return bool(getattr(result, "rowcount", 0))


def note_deployment(session: Session, deployment_id: str, message: str) -> bool:
    """Set a READY deployment's status_message (what happened to its model process);
    returns whether it was READY."""
    stmt = (
        update(Deployment)
        .where(Deployment.id == deployment_id, Deployment.status == DeploymentState.READY)
        .values(status_message=message, updated_at=utcnow())
    )
    result = session.execute(stmt)
    return bool(getattr(result, "rowcount", 0))
