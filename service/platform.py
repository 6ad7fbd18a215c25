"""The composition root: what the API, the worker and `dlaas up` share, built once from
Settings."""

from __future__ import annotations

import threading
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path

import yaml
from sqlalchemy import Engine
from sqlalchemy.orm import Session, sessionmaker

from service.auth import TenantRef, ensure_admin_key
from service.db.session import make_engine, make_sessionmaker, upgrade
from service.dispatch import Dispatcher, make_celery
from service.domain.catalog import DEFAULT_CATALOG, Catalog
from service.logs import LogStore, open_log_store
from service.logs.config import LogSinkConfig
from service.private import private_dir, private_home
from service.secrets import SecretBox, ensure_secret_key
from service.settings import Settings
from service.storage import open_platform_store, platform_store_config
from service.storage.archives import ArchiveLimits
from service.storage.base import ObjectStore
from service.storage.config import StoreConfig
from service.storage.endpoints import EndpointPolicy
from service.ttlcache import TtlCache


def load_catalog(path: Path | None) -> Catalog:
    """The default catalog, with the sections of the operator's YAML file replacing ours."""
    if path is None:
        return DEFAULT_CATALOG
    data = yaml.safe_load(path.read_text())
    if not isinstance(data, dict):
        raise ValueError(f"{path}: a catalog file must be a mapping of sections")
    return DEFAULT_CATALOG.with_overrides(data)


@dataclass
class Platform:
    settings: Settings
    engine: Engine
    sessions: sessionmaker[Session]
    store: ObjectStore
    catalog: Catalog
    admin_key: str
    log_sink: LogSinkConfig = field(default_factory=lambda: LogSinkConfig(kind="file"))
    # Set when there is news for a monitor running in this process (a submission, a stop
    # request), so it reacts now instead of at its next pass.
    monitor_wakeup: threading.Event = field(default_factory=threading.Event)
    # Who a key belongs to: authenticating every request against the database would cost
    # more than the request. Only found keys are kept, so a new key works at once; a
    # revoked key stops working within the ttl.
    tenant_keys: TtlCache[str, TenantRef] = field(default_factory=lambda: TtlCache(30.0))

    @classmethod
    def from_settings(cls, settings: Settings) -> Platform:
        # Owner-only: the home holds keys, the database and logs (service.private).
        private_home(settings.home_dir)
        engine = make_engine(settings.resolved_database_url)
        private_dir(settings.home_dir / "uploads")
        redis_url = settings.resolved_log_store_url
        if redis_url:
            log_sink = LogSinkConfig(kind="redis", url=redis_url)
        else:
            log_sink = LogSinkConfig(kind="file", dir=str(private_dir(settings.home_dir / "logs")))
        EndpointPolicy.from_settings(settings)  # a bad DLAAS_ALLOWED_DATA_ENDPOINTS fails now
        return cls(
            settings=settings,
            engine=engine,
            sessions=make_sessionmaker(engine),
            store=open_platform_store(settings),
            catalog=load_catalog(settings.catalog_file),
            admin_key=ensure_admin_key(settings),
            log_sink=log_sink,
        )

    @cached_property
    def logs(self) -> LogStore:
        return open_log_store(self.log_sink.kind, dir=self.log_sink.dir, url=self.log_sink.url)

    @cached_property
    def dispatcher(self) -> Dispatcher:
        return Dispatcher(make_celery(self.settings))

    @property
    def learner_store(self) -> StoreConfig:
        """How learners reach this platform's object store."""
        return platform_store_config(self.settings)

    @cached_property
    def secrets(self) -> SecretBox:
        """Encrypts the data-store credentials of manifests (service.secrets)."""
        return SecretBox(ensure_secret_key(self.settings))

    @cached_property
    def endpoint_policy(self) -> EndpointPolicy:
        """Which S3 endpoints manifests may name (service.storage.endpoints)."""
        return EndpointPolicy.from_settings(self.settings)

    @property
    def archive_limits(self) -> ArchiveLimits:
        return ArchiveLimits(
            max_files=self.settings.archive_max_files,
            max_unpacked_bytes=self.settings.archive_max_unpacked_bytes,
        )

    @property
    def upload_dir(self) -> Path:
        """Where uploads are spooled while they are checked; emptied after each request."""
        return self.settings.home_dir / "uploads"

    def migrate(self) -> None:
        upgrade(self.engine)

    def close(self) -> None:
        self.engine.dispose()
