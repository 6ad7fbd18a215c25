"""Tenants, their API keys and the key revocation counter."""

from __future__ import annotations

from collections.abc import Collection, Sequence
from datetime import datetime

from sqlalchemy import Connection, func, or_, select, update
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.orm import Session

from service.db.models import ApiKey, KeyRevocations, Tenant, Training
from service.domain.states import TrainingState


def tenant_for_key_hash(session: Session, key_hash: str) -> Tenant | None:
    stmt = (
        select(Tenant)
        .join(ApiKey, ApiKey.tenant_id == Tenant.id)
        .where(ApiKey.key_hash == key_hash, ApiKey.revoked_at.is_(None))
    )
    return session.scalars(stmt).first()


def active_key_for_hash(session: Session, key_hash: str) -> tuple[ApiKey, Tenant] | None:
    """The unrevoked key of that hash and its tenant."""
    stmt = (
        select(ApiKey, Tenant)
        .join(Tenant, ApiKey.tenant_id == Tenant.id)
        .where(ApiKey.key_hash == key_hash, ApiKey.revoked_at.is_(None))
    )
    row = session.execute(stmt).first()
    return None if row is None else (row[0], row[1])


def tenant_keys(session: Session, tenant_id: str) -> Sequence[ApiKey]:
    """The tenant's keys, revoked ones too, oldest first."""
    stmt = select(ApiKey).where(ApiKey.tenant_id == tenant_id)
    return session.scalars(stmt.order_by(ApiKey.created_at, ApiKey.id)).all()


def tenant_key(session: Session, tenant_id: str, key_id: str) -> ApiKey | None:
    """The tenant's key of that id (another tenant's is None)."""
    stmt = select(ApiKey).where(ApiKey.id == key_id, ApiKey.tenant_id == tenant_id)
    return session.scalars(stmt).first()


def active_key_count(session: Session, tenant_id: str) -> int:
    stmt = select(func.count()).where(ApiKey.tenant_id == tenant_id, ApiKey.revoked_at.is_(None))
    return int(session.scalar(stmt) or 0)


def touch_key(session: Session, key_id: str, now: datetime, older_than: datetime) -> None:
    """Set the key's last_used_at to `now` unless it was set at `older_than` or later (a
    process that was beaten to it by another writes nothing)."""
    session.execute(
        update(ApiKey)
        .where(
            ApiKey.id == key_id,
            or_(ApiKey.last_used_at.is_(None), ApiKey.last_used_at < older_than),
        )
        .values(last_used_at=now)
        .execution_options(synchronize_session=False)
    )


_EPOCH_ROW = 1


def revocation_epoch(conn: Connection) -> int:
    """The key revocation counter (0 before the first revocation)."""
    stmt = select(KeyRevocations.epoch).where(KeyRevocations.id == _EPOCH_ROW)
    return int(conn.execute(stmt).scalar() or 0)


def bump_revocation_epoch(session: Session) -> None:
    """Add one to the key revocation counter (creating its row), in the caller's
    transaction."""
    dialect = session.get_bind().dialect.name
    insert = postgresql.insert if dialect == "postgresql" else sqlite.insert
    stmt = insert(KeyRevocations).values(id=_EPOCH_ROW, epoch=1)
    session.execute(
        stmt.on_conflict_do_update(
            index_elements=[KeyRevocations.id], set_={"epoch": KeyRevocations.epoch + 1}
        )
    )


def get_tenant(session: Session, tenant_id: str) -> Tenant | None:
    return session.get(Tenant, tenant_id)


def tenant_by_name(session: Session, name: str) -> Tenant | None:
    return session.scalars(select(Tenant).where(Tenant.name == name)).first()


def tenant_name_of(session: Session, tenant_id: str) -> str | None:
    return session.scalars(select(Tenant.name).where(Tenant.id == tenant_id)).first()


def list_tenants(session: Session) -> Sequence[Tenant]:
    return session.scalars(select(Tenant).order_by(Tenant.created_at, Tenant.id)).all()


def plans_of_queuing_tenants(session: Session) -> dict[str, str]:
    """The plan name of each tenant with a QUEUED training, by tenant id (one index probe
    per tenant, not a read of the queue)."""
    queued = (
        select(Training.id)
        .where(Training.tenant_id == Tenant.id, Training.status == TrainingState.QUEUED)
        .exists()
    )
    return {
        tenant_id: plan
        for tenant_id, plan in session.execute(select(Tenant.id, Tenant.plan).where(queued))
    }


def plans_of_tenants(session: Session, tenant_ids: Collection[str]) -> dict[str, str]:
    """Each tenant's plan name, by tenant id (tenants that do not exist are left out)."""
    stmt = select(Tenant.id, Tenant.plan).where(Tenant.id.in_(tenant_ids))
    return {tenant_id: plan for tenant_id, plan in session.execute(stmt)}
