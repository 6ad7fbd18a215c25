"""API keys: generation, hashing, and the bootstrap admin key."""

from __future__ import annotations

import hashlib
import hmac
import os
import secrets
import string
from dataclasses import dataclass
from pathlib import Path

from service.private import private_dir
from service.settings import Settings

_ID_ALPHABET = string.ascii_lowercase + string.digits


def new_id(length: int = 12) -> str:
    """A random id that is also a valid DNS label (learner host names are built from it)."""
    return secrets.choice(string.ascii_lowercase) + "".join(
        secrets.choice(_ID_ALPHABET) for _ in range(length - 1)
    )


def new_api_key() -> str:
    return "dlaas_" + secrets.token_urlsafe(32)


def hash_api_key(key: str) -> str:
    return hashlib.sha256(key.encode()).hexdigest()


def keys_match(candidate: str, expected: str) -> bool:
    return hmac.compare_digest(hash_api_key(candidate), hash_api_key(expected))


def ensure_admin_key(settings: Settings) -> str:
    """DLAAS_ADMIN_API_KEY if set; else the key in $DLAAS_HOME/admin_api_key, created
    (mode 0600) on first start."""
    if settings.admin_api_key:
        return settings.admin_api_key
    path: Path = settings.admin_key_file
    private_dir(path.parent)
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    except FileExistsError:
        key = path.read_text().strip()
        if not key:
            raise RuntimeError(f"{path} is empty; delete it to generate a new admin key") from None
        return key
    key = new_api_key()
    with os.fdopen(fd, "w") as f:
        f.write(key + "\n")
    return key


@dataclass(frozen=True)
class TenantRef:
    """The authenticated caller: a tenant, as every request needs it."""

    id: str
    name: str
    plan: str
