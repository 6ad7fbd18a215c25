"""How to reach an object store, as plain data a learner's spec carries (see
service.domain.records): the platform's store, or a directory in a user's bucket."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar

from service.domain.records import OPT_STR, STR, OfKind, Secret, SpecError, checked_fields


@dataclass(frozen=True)
class StoreConfig(OfKind):
    """How to reach an object store (see service.storage.open_store): the platform's, or a
    user's bucket."""

    kind: str  # "local" or "s3"
    root: str | None = None  # local
    endpoint: str | None = None  # s3
    access_key: Secret | None = None
    secret_key: Secret | None = None
    # Temporary credentials (STS): the token that goes with access_key and secret_key.
    session_token: Secret | None = None
    bucket: str | None = None
    region: str | None = None
    # A user's bucket: the DLAAS_ALLOWED_DATA_ENDPOINTS entries that allow its endpoint
    # (service.storage.endpoints), checked again when it is opened; None for a store the
    # operator configured (the platform's own), which is not checked.
    allowed_endpoints: tuple[str, ...] | None = None

    NAME: ClassVar[str] = "store"
    KINDS: ClassVar[tuple[str, ...]] = ("local", "s3")
    _TYPES: ClassVar[dict[str, tuple[type, ...]]] = {
        "kind": STR,
        "root": OPT_STR,
        "endpoint": OPT_STR,
        "access_key": OPT_STR,
        "secret_key": OPT_STR,
        "session_token": OPT_STR,
        "bucket": OPT_STR,
        "region": OPT_STR,
        "allowed_endpoints": (list, tuple, type(None)),
    }

    @classmethod
    def from_dict(cls, data: Any, where: str = "store") -> StoreConfig:
        values = checked_fields(cls, data, where)
        for key in ("access_key", "secret_key", "session_token"):
            values[key] = Secret.of(values.get(key))
        allowed = values.get("allowed_endpoints")
        if allowed is not None:
            if not all(isinstance(e, str) for e in allowed):
                raise SpecError(f"{where}.allowed_endpoints: a list of strings is expected")
            values["allowed_endpoints"] = tuple(allowed)
        return cls(**values)


@dataclass(frozen=True)
class BucketLocation:
    """A directory in a user's bucket: training data to fetch, or where results go."""

    store: StoreConfig
    prefix: str = ""

    _TYPES: ClassVar[dict[str, tuple[type, ...]]] = {"prefix": STR}

    @classmethod
    def from_dict(cls, data: Any, where: str) -> BucketLocation:
        values = checked_fields(cls, data, where)
        values["store"] = StoreConfig.from_dict(values["store"], f"{where}.store")
        return cls(**values)
