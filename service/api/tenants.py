"""Tenants and their API keys (admin only)."""

from __future__ import annotations

from fastapi import APIRouter, status

from service import tenants as service
from service.api.deps import AdminOnly, SessionDep
from service.api.schemas import TenantCreate, TenantCreated, TenantList, TenantOut
from service.db import repository
from service.http.app import PlatformDep

router = APIRouter(prefix="/v1/tenants", tags=["tenants"], dependencies=[AdminOnly])


@router.post("", status_code=status.HTTP_201_CREATED, response_model=TenantCreated)
def create_tenant(body: TenantCreate, platform: PlatformDep, session: SessionDep) -> TenantCreated:
    """Create a tenant and its first API key; the key is in this response only."""
    tenant, key = service.create_tenant(session, platform.catalog, body.name, body.plan)
    session.commit()
    return TenantCreated(**TenantOut.of(tenant).model_dump(), api_key=key)


@router.get("", response_model=TenantList)
def list_tenants(session: SessionDep) -> TenantList:
    return TenantList(items=[TenantOut.of(t) for t in repository.list_tenants(session)])
