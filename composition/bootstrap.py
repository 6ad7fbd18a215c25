"""First start of `dlaas up`: the `local` tenant and the client configuration holding its
key, so `dlaas train ...` and `dlaas.Client()` need no flags."""

from __future__ import annotations

from pathlib import Path

from dlaas.config import ClientConfig, config_path, load_config, write_config
from service import tenants
from service.auth import hash_api_key
from service.db import repository
from service.platform import Platform
from service.tenants import LOCAL_TENANT

LOCAL_PLAN = "standard"


def client_url(host: str, port: int) -> str:
    """The URL a client on this machine uses for an API listening on host:port."""
    if host in ("0.0.0.0", ""):  # noqa: S104 - the address a user passes, not one we bind
        host = "127.0.0.1"
    elif host == "::":
        host = "::1"
    if ":" in host:
        host = f"[{host}]"
    return f"http://{host}:{port}"


def ensure_local_tenant(platform: Platform, url: str) -> tuple[Path, str]:
    """The `local` tenant and the client configuration that holds its key.

    Creates the tenant on first start; writes a fresh key only when the configuration has
    none that this platform accepts (keys are stored hashed and cannot be read back).
    Returns the configuration's path and the tenant's name.
    """
    path = config_path(platform.settings.home_dir)
    existing = load_config(path)
    with platform.sessions() as session:
        if existing is not None and existing.api_key:
            tenant = repository.tenant_for_key_hash(session, hash_api_key(existing.api_key))
            if tenant is not None:
                if existing.url != url or existing.tenant != tenant.name:
                    write_config(ClientConfig(url, existing.api_key, tenant.name), path)
                return path, tenant.name
        tenant = repository.tenant_by_name(session, LOCAL_TENANT)
        if tenant is None:
            plans = platform.catalog.plans
            plan = LOCAL_PLAN if LOCAL_PLAN in plans else next(iter(plans))
            tenant, key = tenants.create_tenant(session, platform.catalog, LOCAL_TENANT, plan)
        else:
            key = tenants.issue_key(session, tenant)
        session.commit()
        name = tenant.name
    write_config(ClientConfig(url, key, name), path)
    return path, name
