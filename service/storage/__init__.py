"""Object storage: one ObjectStore protocol, a local directory and S3 (see base)."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from service.settings import Settings
    from service.storage.base import ObjectStore


def open_platform_store(settings: Settings) -> ObjectStore:
    """The platform's own store: the DLAAS_S3_* bucket (created on first use) when
    DLAAS_S3_ENDPOINT is set, else the directory under DLAAS_HOME."""
    # Imported here: learners import this package and must start fast (no minio, no
    # settings) when their store is a local directory.
    from service.storage.local import LocalObjectStore
    from service.storage.s3 import S3ObjectStore, check_bucket_name

    if settings.s3_endpoint:
        bad_bucket = check_bucket_name(settings.s3_bucket)
        if bad_bucket is not None:
            raise ValueError(f"DLAAS_S3_BUCKET={settings.s3_bucket!r} {bad_bucket}")
        secret = settings.s3_secret_key
        try:
            return S3ObjectStore(
                settings.s3_endpoint,
                settings.s3_bucket,
                access_key=settings.s3_access_key,
                secret_key=secret.get_secret_value() if secret is not None else None,
                region=settings.s3_region,
                create_bucket=True,
            )
        except ValueError as e:
            raise ValueError(f"DLAAS_S3_ENDPOINT={settings.s3_endpoint!r} {e}") from e
    return LocalObjectStore(settings.object_store_dir)
