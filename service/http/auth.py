"""Who is calling: the API key of a request and the tenant it belongs to.

A request carries its key in `Authorization: Bearer <key>` or, from the dashboard (/ui/),
in its session cookie: the key sealed (Fernet) with a key derived from the platform's
secret key, HttpOnly and SameSite=Strict, so the pages' scripts never hold the key. The
header wins where both are sent. A state-changing request that the cookie authenticates
must also carry the `X-DLaaS-CSRF` header and, where the browser names one, an Origin of
this very site: a page of another site can make the browser send the cookie (SameSite
stops that in current browsers), but can neither add a custom header without a CORS
preflight this API never grants nor hide its Origin.
"""

from __future__ import annotations

from urllib.parse import urlsplit

from fastapi import Request

from service import tenants
from service.auth import TenantRef, hash_api_key, keys_match
from service.db import repository
from service.errors import Forbidden, Unauthorized
from service.platform import Platform
from service.secrets import SecretsUnreadable

SESSION_COOKIE = "dlaas_session"
CSRF_HEADER = "X-DLaaS-CSRF"
_SAFE_METHODS = frozenset({"GET", "HEAD", "OPTIONS"})


def caller_key(request: Request) -> str:
    """The request's API key: its Authorization header, else its session cookie."""
    header = request.headers.get("authorization")
    if header is None:
        sealed = request.cookies.get(SESSION_COOKIE)
        if sealed:
            platform: Platform = request.app.state.platform
            key = open_session(platform, sealed)
            if request.method not in _SAFE_METHODS:
                check_cookie_request(request)
            return key
        header = ""
    return key_of_header(header)


def key_of_header(header: str) -> str:
    """The API key of an `Authorization: Bearer <key>` header (or gRPC metadata entry)."""
    scheme, _, key = header.partition(" ")
    if scheme.lower() != "bearer" or not key.strip():
        raise Unauthorized("send your API key as 'Authorization: Bearer <key>'")
    return key.strip()


def seal_session(platform: Platform, key: str) -> str:
    """The session cookie's value for `key`."""
    return platform.session_seal.encrypt(key)


def open_session(platform: Platform, sealed: str) -> str:
    """The key a session cookie holds; Unauthorized once it is older than
    DLAAS_SESSION_MAX_AGE, or if it was not sealed by this platform."""
    try:
        return platform.session_seal.decrypt(sealed, ttl=platform.settings.session_max_age)
    except SecretsUnreadable as e:
        raise Unauthorized(
            "the dashboard session has expired or is not valid; sign in again"
        ) from e


def same_origin(request: Request) -> bool:
    """Whether the request's Origin (or, without one, its Referer) is this site; a request
    that names neither is a client's, not a page's, and passes."""
    source = request.headers.get("origin") or request.headers.get("referer")
    if source is None:
        return True
    host = request.headers.get("host", "")
    return urlsplit(source).netloc.lower() == host.lower()


def check_cookie_request(request: Request) -> None:
    """Forbidden unless a state-changing request authenticated by the cookie comes from
    this site's own pages (see the module's docstring)."""
    if request.headers.get(CSRF_HEADER) != "1":
        raise Forbidden(
            f"a request authenticated by the dashboard's session cookie must send the "
            f"{CSRF_HEADER}: 1 header; other clients send 'Authorization: Bearer <key>'"
        )
    if not same_origin(request):
        raise Forbidden("a cross-site request with the dashboard's session cookie is refused")


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
