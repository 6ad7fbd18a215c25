"""Who is calling: the API key of a request and the tenant it belongs to."""

from __future__ import annotations

from fastapi import Request

from service import tenants
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
    """The tenant whose API key `key` is (blocking: the database on a cache miss, and
    once a second for revocations, see KeyCache)."""
    key_hash = hash_api_key(key)
    keys = platform.tenant_keys
    keys.refresh(platform.revocation_epoch)
    cached = keys.get(key_hash)
    if cached is not None:
        return cached
    generation = keys.generation
    with platform.sessions() as session:
        found = repository.active_key_for_hash(session, key_hash)
        if found is not None:
            api_key, tenant = found
            ref = TenantRef(tenant.id, tenant.name, tenant.plan)
            if tenants.record_use(session, api_key):
                session.commit()
            keys.put(key_hash, ref, generation)
            return ref
    if keys_match(key, platform.admin_key):
        raise Forbidden(
            "the admin key manages tenants only; use a tenant's API key for this request"
        )
    raise Unauthorized("the API key is not valid")
