"""What a tenant holds against its plan: trainings by state, the learners its active
trainings hold, stored bytes and deployments (the usage endpoint and the checks made on
submitting a training or creating a deployment)."""

from __future__ import annotations

from sqlalchemy import func, select
from sqlalchemy.orm import Session

from service.db.models import Deployment, Training
from service.domain.states import ACTIVE_STATES


def tenant_active_nodes(session: Session, tenant_id: str) -> int:
    """The learners (nodes) the tenant's active trainings hold."""
    stmt = select(func.coalesce(func.sum(Training.nodes), 0)).where(
        Training.tenant_id == tenant_id, Training.status.in_(ACTIVE_STATES)
    )
    return int(session.scalar(stmt) or 0)


def tenant_training_count(session: Session, tenant_id: str, *statuses: str) -> int:
    """How many of the tenant's trainings are in one of `statuses`."""
    stmt = select(func.count()).where(
        Training.tenant_id == tenant_id, Training.status.in_(statuses)
    )
    return int(session.scalar(stmt) or 0)


def tenant_stored_bytes(session: Session, tenant_id: str) -> int:
    """The bytes stored for the tenant's trainings: code archives, results and saved
    checkpoints."""
    stored = Training.code_bytes + Training.results_bytes + Training.checkpoint_bytes
    stmt = select(func.coalesce(func.sum(stored), 0)).where(Training.tenant_id == tenant_id)
    return int(session.scalar(stmt) or 0)


def tenant_deployment_count(session: Session, tenant_id: str) -> int:
    """How many deployments the tenant keeps (whatever their status)."""
    stmt = select(func.count()).where(Deployment.tenant_id == tenant_id)
    return int(session.scalar(stmt) or 0)
