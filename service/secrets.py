"""Data-store credentials at rest: encrypted in the database, masked in the API.

A manifest's `training_data_reference` and `training_results_reference` carry S3
credentials (`connection.access_key_id`, `connection.secret_access_key`). The stored
manifest holds them encrypted (Fernet: AES-128-CBC + HMAC-SHA256) as `fernet:<token>`,
with a key derived from DLAAS_SECRET_KEY, or from a key generated into
`$DLAAS_HOME/secret_key` (mode 0600) on first use. Only the worker decrypts them, to hand
them to the learners in their private spec files. API responses show `***`.
"""

from __future__ import annotations

import base64
import contextlib
import copy
import hashlib
import os
import secrets
from pathlib import Path
from typing import Any

from cryptography.fernet import Fernet, InvalidToken

from service.private import private_dir
from service.settings import Settings

REFERENCES = ("training_data_reference", "training_results_reference")
CREDENTIAL_FIELDS = ("access_key_id", "secret_access_key")
MASK = "***"
_PREFIX = "fernet:"


class SecretsUnreadable(Exception):
    """A stored credential cannot be decrypted (the secret key changed?)."""


def ensure_secret_key(settings: Settings) -> str:
    """DLAAS_SECRET_KEY if set; else the key in $DLAAS_HOME/secret_key, generated (mode
    0600) on first use. Publishing it is atomic, so concurrent first users agree."""
    if settings.secret_key is not None:
        value = settings.secret_key.get_secret_value()
        if not value.strip():
            raise RuntimeError("DLAAS_SECRET_KEY is set but empty")
        return value
    path: Path = settings.secret_key_file
    if not path.exists():
        private_dir(path.parent)
        tmp = path.with_name(f".secret_key-{os.getpid()}-{secrets.token_hex(4)}")
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        try:
            with os.fdopen(fd, "w") as f:
                f.write(secrets.token_urlsafe(32) + "\n")
            # Fails if another process published first: theirs is kept.
            with contextlib.suppress(FileExistsError):
                os.link(tmp, path)
        finally:
            tmp.unlink(missing_ok=True)
    key = path.read_text().strip()
    if not key:
        raise RuntimeError(f"{path} is empty; restore it (stored credentials need it)")
    return key


class SecretBox:
    """Encrypts and decrypts short strings with a key derived from any passphrase."""

    def __init__(self, key: str) -> None:
        digest = hashlib.sha256(key.encode()).digest()
        self._fernet = Fernet(base64.urlsafe_b64encode(digest))

    def encrypt(self, value: str) -> str:
        return _PREFIX + self._fernet.encrypt(value.encode()).decode("ascii")

    def decrypt(self, value: str, ttl: int | None = None) -> str:
        """The plain value; with `ttl`, only of a value encrypted at most `ttl` seconds ago."""
        if not value.startswith(_PREFIX):
            raise SecretsUnreadable("a stored credential is not encrypted")
        try:
            token = value[len(_PREFIX) :].encode("ascii")
            return self._fernet.decrypt(token, ttl=ttl).decode()
        except (InvalidToken, ValueError) as e:
            raise SecretsUnreadable(
                "a stored credential cannot be decrypted; was DLAAS_SECRET_KEY (or "
                "$DLAAS_HOME/secret_key) changed since the training was submitted?"
            ) from e


def seal_manifest(doc: dict[str, Any], box: SecretBox) -> dict[str, Any]:
    """A copy of the manifest document with every credential encrypted."""
    out = dict(doc)
    for name in REFERENCES:
        ref = doc.get(name)
        if not isinstance(ref, dict) or not isinstance(ref.get("connection"), dict):
            continue
        out[name] = sealed = copy.deepcopy(ref)  # each its own copy, encrypted once
        connection = sealed["connection"]
        for field in CREDENTIAL_FIELDS:
            if isinstance(connection.get(field), str):
                connection[field] = box.encrypt(connection[field])
    return out


def open_reference(ref: dict[str, Any], box: SecretBox) -> dict[str, Any]:
    """A copy of one stored reference with its credentials decrypted."""
    out = copy.deepcopy(ref)
    connection = out.get("connection")
    if isinstance(connection, dict):
        for field in CREDENTIAL_FIELDS:
            if isinstance(connection.get(field), str):
                connection[field] = box.decrypt(connection[field])
    return out


def masked_reference(ref: Any) -> dict[str, Any] | None:
    """A stored reference as the API shows it: credentials replaced by ***."""
    if not isinstance(ref, dict):
        return None
    out = copy.deepcopy(ref)
    connection = out.get("connection")
    if isinstance(connection, dict):
        for field in CREDENTIAL_FIELDS:
            if field in connection:
                connection[field] = MASK
    return out


# A submitted manifest's credentials, in any format's words: the platform's, FfDL's
# (`user_name`, `password`), wherever a `connection` mapping holds them.
SUBMITTED_CREDENTIAL_FIELDS = (*CREDENTIAL_FIELDS, "user_name", "password")


def masked_document(doc: Any) -> Any:
    """A copy of a submitted manifest with the credentials of every `connection` in it
    replaced by ***: what is kept of the manifest as sent (the translated one holds them,
    sealed) and shown back."""
    if isinstance(doc, list):
        return [masked_document(item) for item in doc]
    if not isinstance(doc, dict):
        return doc
    out: dict[str, Any] = {}
    for key, value in doc.items():
        if key == "connection" and isinstance(value, dict):
            out[key] = {
                k: MASK if k in SUBMITTED_CREDENTIAL_FIELDS else masked_document(v)
                for k, v in value.items()
            }
        else:
            out[key] = masked_document(value)
    return out
