"""What the platform does with tenants: create one on a plan, issue API keys.

Services never commit; the request (or the command) that calls them owns the transaction.
Keys are stored hashed (with their first characters, to tell them apart): a key is shown
once, by the call that issued it, and cannot be read back.
"""

from __future__ import annotations

from sqlalchemy.orm import Session

from service.auth import hash_api_key, new_api_key, new_id
from service.db import repository
from service.db.models import ApiKey, Tenant
from service.domain.catalog import Catalog
from service.errors import Conflict, FieldError, ValidationFailed

# The tenant `dlaas up` creates for the machine's own user: the one whose trainings may
# run unsandboxed where no sandbox can be made.
LOCAL_TENANT = "local"
# How many of a key's first characters are stored in clear (ApiKey.prefix).
KEY_PREFIX_CHARS = 12


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
    key = new_api_key()
    session.add(
        ApiKey(
            id=new_id(),
            tenant_id=tenant.id,
            key_hash=hash_api_key(key),
            prefix=key[:KEY_PREFIX_CHARS],
        )
    )
    session.flush()
    return key
