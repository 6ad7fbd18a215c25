"""What the platform does with tenants: create one on a plan, issue, rotate and revoke
API keys.

Services never commit; the request (or the command) that calls them owns the transaction.
Keys are stored hashed (with their first characters, to tell them apart): a key is shown
once, by the call that issued it, and cannot be read back. A revoked key keeps its row,
with `revoked_at` set.
"""

from __future__ import annotations

from datetime import datetime, timedelta

from sqlalchemy.orm import Session

from service.auth import hash_api_key, new_api_key, new_id
from service.db import repository
from service.db.models import ApiKey, Tenant, utcnow
from service.domain.catalog import Catalog
from service.errors import Conflict, FieldError, NotFound, ValidationFailed

# The tenant `dlaas up` creates for the machine's own user: the one whose trainings may
# run unsandboxed where no sandbox can be made.
LOCAL_TENANT = "local"
# How many of a key's first characters are stored in clear (ApiKey.prefix): "dlaas_" and
# 6 random characters (36 bits), enough to tell keys apart, far too few to guess the rest.
KEY_PREFIX_CHARS = 12
# Unrevoked keys a tenant may hold at once through the API (rotation needs two).
MAX_ACTIVE_KEYS = 10
# ApiKey.last_used_at is written at most this often per key.
LAST_USED_RESOLUTION = timedelta(minutes=1)


def create_tenant(session: Session, catalog: Catalog, name: str, plan: str) -> tuple[Tenant, str]:
    """Insert a tenant on `plan` and issue its first API key; returns both.

    ValidationFailed (naming `plan`) if the catalog offers no such plan, Conflict if a
    tenant of that name exists.
    """
    if plan not in catalog.plans:
        offered = ", ".join(catalog.plans)
        raise ValidationFailed([FieldError("plan", f"unknown plan '{plan}'; offered: {offered}")])
    if repository.tenant_by_name(session, name) is not None:
        raise Conflict(f"a tenant named '{name}' already exists")
    tenant = Tenant(id=new_id(), name=name, plan=plan)
    session.add(tenant)
    session.flush()
    return tenant, issue_key(session, tenant)


def issue_key(session: Session, tenant: Tenant) -> str:
    """A new API key for the tenant (its other keys stay valid); returns the key, which
    is stored only as its hash and prefix."""
    return _new_key(session, tenant)[1]


def add_key(session: Session, tenant_id: str) -> tuple[ApiKey, str]:
    """Another API key for the tenant (POST /v1/tenants/{id}/keys): its row and the key.

    NotFound for an unknown tenant; Conflict if it already holds MAX_ACTIVE_KEYS unrevoked
    keys.
    """
    tenant = repository.get_tenant(session, tenant_id)
    if tenant is None:
        raise NotFound(f"tenant {tenant_id} not found")
    if repository.active_key_count(session, tenant.id) >= MAX_ACTIVE_KEYS:
        raise Conflict(
            f"tenant {tenant_id} already holds {MAX_ACTIVE_KEYS} unrevoked API keys; "
            "revoke one first"
        )
    return _new_key(session, tenant)


def _new_key(session: Session, tenant: Tenant) -> tuple[ApiKey, str]:
    key = new_api_key()
    row = ApiKey(
        id=new_id(),
        tenant_id=tenant.id,
        key_hash=hash_api_key(key),
        prefix=key[:KEY_PREFIX_CHARS],
        created_at=utcnow(),
    )
    session.add(row)
    session.flush()
    return row, key


def list_keys(session: Session, tenant_id: str) -> list[ApiKey]:
    """The tenant's keys, revoked ones too, oldest first; NotFound for an unknown tenant."""
    if repository.get_tenant(session, tenant_id) is None:
        raise NotFound(f"tenant {tenant_id} not found")
    return list(repository.tenant_keys(session, tenant_id))


def revoke_key(session: Session, tenant_id: str, key_id: str) -> ApiKey:
    """Revoke the tenant's key `key_id` (again: a no-op) and bump the revocation counter
    in the same transaction, so every API process drops the keys it remembers within a
    second of the commit. NotFound for a key the tenant does not hold."""
    row = repository.tenant_key(session, tenant_id, key_id)
    if row is None:
        raise NotFound(f"API key {key_id} of tenant {tenant_id} not found")
    if row.revoked_at is None:
        row.revoked_at = utcnow()
        repository.bump_revocation_epoch(session)
        session.flush()
    return row


def record_use(session: Session, key: ApiKey, now: datetime | None = None) -> bool:
    """Note that `key` authenticated a request, if its last_used_at is older than
    LAST_USED_RESOLUTION; returns whether a write was made (for the caller to commit)."""
    now = now or utcnow()
    older_than = now - LAST_USED_RESOLUTION
    if key.last_used_at is not None and key.last_used_at >= older_than:
        return False
    repository.touch_key(session, key.id, now, older_than)
    return True
