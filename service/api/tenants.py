"""Tenants (admin only) and their API keys (the admin, or the tenant for its own)."""

from __future__ import annotations

from fastapi import APIRouter, Request, Response, status

from service import tenants as service
from service.api.deps import AdminOnly, KeyOwner, SessionDep
from service.api.schemas import (
    ApiKeyCreated,
    ApiKeyList,
    ApiKeyOut,
    TenantCreate,
    TenantCreated,
    TenantList,
    TenantOut,
)
from service.db import repository
from service.http.app import PlatformDep

router = APIRouter(prefix="/v1/tenants", tags=["tenants"])


@router.post(
    "",
    status_code=status.HTTP_201_CREATED,
    response_model=TenantCreated,
    dependencies=[AdminOnly],
    responses={409: {"description": "A tenant of that name exists"}},
)
def create_tenant(body: TenantCreate, platform: PlatformDep, session: SessionDep) -> TenantCreated:
    """Create a tenant and its first API key; the key is in this response only."""
    tenant, key = service.create_tenant(session, platform.catalog, body.name, body.plan)
    session.commit()
    return TenantCreated(**TenantOut.of(tenant).model_dump(), api_key=key)


@router.get("", response_model=TenantList, dependencies=[AdminOnly])
def list_tenants(session: SessionDep) -> TenantList:
    return TenantList(items=[TenantOut.of(t) for t in repository.list_tenants(session)])


_KEY_RESPONSES: dict[int | str, dict[str, str]] = {
    404: {"description": "No such tenant (or not the caller's), or no such key of it"}
}


@router.post(
    "/{tenant_id}/keys",
    status_code=status.HTTP_201_CREATED,
    response_model=ApiKeyCreated,
    responses={**_KEY_RESPONSES, 409: {"description": "The tenant holds too many valid keys"}},
)
def create_tenant_key(tenant_id: KeyOwner, session: SessionDep) -> ApiKeyCreated:
    """Issue another API key for the tenant; the key is in this response only. Its other
    keys stay valid: rotate by creating one, switching to it, and revoking the old one."""
    row, key = service.add_key(session, tenant_id)
    session.commit()
    return ApiKeyCreated(**ApiKeyOut.of(row).model_dump(), api_key=key)


@router.get("/{tenant_id}/keys", response_model=ApiKeyList, responses=_KEY_RESPONSES)
def list_tenant_keys(tenant_id: KeyOwner, session: SessionDep) -> ApiKeyList:
    """The tenant's keys, revoked ones too, oldest first (never the keys themselves)."""
    return ApiKeyList(items=[ApiKeyOut.of(k) for k in service.list_keys(session, tenant_id)])


@router.delete(
    "/{tenant_id}/keys/{key_id}",
    status_code=status.HTTP_204_NO_CONTENT,
    responses=_KEY_RESPONSES,
)
def revoke_tenant_key(
    tenant_id: KeyOwner, key_id: str, platform: PlatformDep, session: SessionDep, request: Request
) -> Response:
    """Revoke the key: refused by every API process within a second. Its row stays, with
    `revoked` set; revoking it again changes nothing."""
    row = service.revoke_key(session, tenant_id, key_id)
    session.commit()
    # This process forgets it now; the others within a second (service.platform.KeyCache).
    platform.tenant_keys.forget_all()
    scoring = getattr(request.app.state, "scoring", None)
    if scoring is not None:
        scoring.targets.forget(lambda target: target[0] == row.key_hash)
    return Response(status_code=status.HTTP_204_NO_CONTENT)
