"""Tenants and their API keys (admin only)."""

from __future__ import annotations

from fastapi import APIRouter, status

from service.api.deps import AdminOnly, SessionDep
from service.api.schemas import TenantCreate, TenantCreated, TenantList, TenantOut
from service.auth import hash_api_key, new_api_key, new_id
from service.db import repository
from service.db.models import ApiKey, Tenant
from service.errors import Conflict, FieldError, ValidationFailed
from service.http.app import PlatformDep

router = APIRouter(prefix="/v1/tenants", tags=["tenants"], dependencies=[AdminOnly])


@router.post("", status_code=status.HTTP_201_CREATED, response_model=TenantCreated)
def create_tenant(body: TenantCreate, platform: PlatformDep, session: SessionDep) -> TenantCreated:
    """Create a tenant and its first API key; the key is in this response only."""
    if body.plan not in platform.catalog.plans:
        offered = ", ".join(platform.catalog.plans)
        raise ValidationFailed(
            [FieldError("plan", f"unknown plan '{body.plan}'; offered: {offered}")]
        )
    if repository.tenant_by_name(session, body.name) is not None:
        raise Conflict(f"a tenant named '{body.name}' already exists")
    key = new_api_key()
    tenant = Tenant(id=new_id(), name=body.name, plan=body.plan)
    session.add(tenant)
    session.flush()
    session.add(
        ApiKey(id=new_id(), tenant_id=tenant.id, key_hash=hash_api_key(key), prefix=key[:12])
    )
    session.commit()
    return TenantCreated(**TenantOut.of(tenant).model_dump(), api_key=key)


@router.get("", response_model=TenantList)
def list_tenants(session: SessionDep) -> TenantList:
    return TenantList(items=[TenantOut.of(t) for t in repository.list_tenants(session)])
