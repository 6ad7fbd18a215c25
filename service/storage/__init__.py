"""Object storage: one ObjectStore protocol (see base), a local directory and S3, opened
from a StoreConfig (see config) by `open_store`, the one place that builds a store."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from service.domain.records import Secret
from service.storage.config import StoreConfig

if TYPE_CHECKING:
    from service.settings import Settings
    from service.storage.base import ObjectStore
    from service.storage.endpoints import AddressPins, Resolver


class StoreConfigError(ValueError):
    """A StoreConfig that names no usable store; the message says what is missing."""


def open_store(
    config: StoreConfig, *, create_bucket: bool = False, resolve: Resolver | None = None
) -> ObjectStore:
    """The object store `config` describes: a local directory, or an S3 bucket (created if
    missing when `create_bucket`). Raises StoreConfigError for an unusable config.

    A user's bucket (`config.allowed_endpoints` set) is checked again now: its endpoint's
    host is resolved once (by `resolve`, default the system's resolver), every address
    checked against those entries, and the store connects to that address only; an
    endpoint they no longer allow is a StoreConfigError naming it and the address."""
    # Imported here: learners import this package and must start fast (no minio) when
    # their store is a local directory.
    if config.kind == "local":
        from service.storage.local import LocalObjectStore

        if not config.root:
            raise StoreConfigError("the store configuration names a local store without a root")
        return LocalObjectStore(Path(config.root))
    if config.kind == "s3":
        from service.storage.s3 import S3ObjectStore

        if not config.endpoint or not config.bucket:
            raise StoreConfigError(
                "the store configuration names an S3 store without an endpoint or bucket"
            )
        pins = None
        if config.allowed_endpoints is not None:
            pins = _pins(config.endpoint, config.allowed_endpoints, resolve)
        try:
            return S3ObjectStore(
                config.endpoint,
                config.bucket,
                access_key=Secret.reveal(config.access_key),
                secret_key=Secret.reveal(config.secret_key),
                session_token=Secret.reveal(config.session_token),
                region=config.region,
                create_bucket=create_bucket,
                connect_to=None if pins is None else pins.address,
            )
        except ValueError as e:
            raise StoreConfigError(f"the S3 endpoint {config.endpoint} is unusable: {e}") from e
    raise StoreConfigError(f"{config.kind} store not available in this build")


def _pins(endpoint: str, allowed: tuple[str, ...], resolve: Resolver | None) -> AddressPins:
    from service.storage import endpoints

    try:
        policy = endpoints.EndpointPolicy.of(allowed, resolve or endpoints.resolve_host)
        return policy.pin(endpoint)
    except ValueError as e:  # EndpointRefused, or an entry that is not one
        raise StoreConfigError(f"the S3 endpoint {endpoint} is refused: {e}") from e


def platform_store_config(settings: Settings) -> StoreConfig:
    """The platform's own store, as learners and the services reach it: the DLAAS_S3_*
    bucket when DLAAS_S3_ENDPOINT is set, else the directory under DLAAS_HOME."""
    if settings.s3_endpoint:
        return StoreConfig(
            kind="s3",
            endpoint=settings.s3_endpoint,
            access_key=Secret.of(settings.s3_access_key),
            secret_key=Secret.of(settings.s3_secret_key),
            bucket=settings.s3_bucket,
            region=settings.s3_region,
        )
    return StoreConfig(kind="local", root=str(settings.object_store_dir))


def open_platform_store(settings: Settings) -> ObjectStore:
    """The platform's own store (see platform_store_config), its bucket created on first
    use. Raises ValueError naming the DLAAS_S3_* setting at fault."""
    from service.storage.s3 import check_bucket_name

    config = platform_store_config(settings)
    if config.kind == "s3":
        bad_bucket = check_bucket_name(settings.s3_bucket)
        if bad_bucket is not None:
            raise ValueError(f"DLAAS_S3_BUCKET={settings.s3_bucket!r} {bad_bucket}")
        try:
            return open_store(config, create_bucket=True)
        except StoreConfigError as e:
            why = e.__cause__ or e  # the endpoint's own fault, as S3ObjectStore names it
            raise ValueError(f"DLAAS_S3_ENDPOINT={settings.s3_endpoint!r} {why}") from e
    return open_store(config)
