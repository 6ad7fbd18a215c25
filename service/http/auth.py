"""Who is calling: the API key of a request and the tenant it belongs to."""

from __future__ import annotations

from fastapi import Request

from service.auth import TenantRef, hash_api_key, keys_match
from service.db import repository
from service.errors import Forbidden, Unauthorized
from service.platform import Platform


def bearer_key(request: Request) -> str:
    header = request.headers.get("authorization", "")
    scheme, _, key = header.partition(" ")
    if scheme.lower() != "bearer" or not key.strip():
        raise Unauthorized("send your API key as 'Authorization: Bearer <key>'")
    return key.strip()


def authenticate(platform: Platform, key: str) -> TenantRef:
    """The tenant whose API key `key` is (blocking: the database on a cache miss)."""
    key_hash = hash_api_key(key)
    cached = platform.tenant_keys.get(key_hash)
    if cached is not None:
        return cached
    with platform.sessions() as session:
        tenant = repository.tenant_for_key_hash(session, key_hash)
        if tenant is not None:
            ref = TenantRef(tenant.id, tenant.name, tenant.plan)
            platform.tenant_keys.put(key_hash, ref)
            return ref
    if keys_match(key, platform.admin_key):
        raise Forbidden(
            "the admin key manages tenants only; use a tenant's API key for this request"
        )
    raise Unauthorized("the API key is not valid")
