"""The repository's queries and the services over them (tenants, trainings), on SQLite
and PostgreSQL, without the HTTP layer."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from sqlalchemy import func, select
from sqlalchemy.orm import Session

from service import tenants
from service.auth import TenantRef, hash_api_key
from service.db import repository
from service.db.models import ApiKey
from service.errors import Conflict, ValidationFailed
from service.platform import Platform


@pytest.fixture
def session(platform: Platform) -> Iterator[Session]:
    platform.migrate()
    with platform.sessions() as s:
        yield s


def _tenant(session: Session, platform: Platform, name: str = "acme") -> TenantRef:
    tenant, _ = tenants.create_tenant(session, platform.catalog, name, "standard")
    session.commit()
    return TenantRef(tenant.id, tenant.name, tenant.plan)


# -- tenants -----------------------------------------------------------------------------


def test_a_new_tenant_gets_a_key_that_authenticates(session: Session, platform: Platform) -> None:
    tenant, key = tenants.create_tenant(session, platform.catalog, "acme", "lite")
    session.commit()
    assert (tenant.name, tenant.plan) == ("acme", "lite")
    found = repository.tenant_for_key_hash(session, hash_api_key(key))
    assert found is not None and found.id == tenant.id
    stored = session.scalars(select(ApiKey).where(ApiKey.tenant_id == tenant.id)).one()
    assert stored.prefix == key[:12] and stored.key_hash != key


def test_a_tenant_needs_an_offered_plan_and_a_free_name(
    session: Session, platform: Platform
) -> None:
    with pytest.raises(ValidationFailed) as refused:
        tenants.create_tenant(session, platform.catalog, "acme", "platinum")
    assert [e.field for e in refused.value.errors] == ["plan"]
    assert "unknown plan 'platinum'; offered: " in refused.value.errors[0].message
    _tenant(session, platform, "acme")
    with pytest.raises(Conflict, match="a tenant named 'acme' already exists"):
        tenants.create_tenant(session, platform.catalog, "acme", "standard")


def test_the_tenant_services_leave_the_commit_to_the_caller(
    session: Session, platform: Platform
) -> None:
    tenant, _ = tenants.create_tenant(session, platform.catalog, "acme", "standard")
    tenants.issue_key(session, tenant)
    session.rollback()
    assert repository.tenant_by_name(session, "acme") is None
    assert session.scalar(select(func.count()).select_from(ApiKey)) == 0


def test_an_existing_tenant_can_be_issued_another_key(session: Session, platform: Platform) -> None:
    """What `dlaas up` does for its `local` tenant when the client has lost its key."""
    tenant, first = tenants.create_tenant(session, platform.catalog, "local", "standard")
    session.commit()
    found = repository.tenant_by_name(session, "local")
    assert found is not None
    second = tenants.issue_key(session, found)
    session.commit()
    assert second != first
    for key in (first, second):
        owner = repository.tenant_for_key_hash(session, hash_api_key(key))
        assert owner is not None and owner.id == tenant.id
