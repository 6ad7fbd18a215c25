"""The composition root: what the API, the worker and `dlaas up` share, built once from
Settings."""

from __future__ import annotations

import math
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path

import yaml
from sqlalchemy import Engine
from sqlalchemy.orm import Session, sessionmaker

from service import runtimes
from service.auth import TenantRef, ensure_admin_key
from service.db import repository
from service.db.session import make_engine, make_sessionmaker, upgrade
from service.dispatch import Dispatcher, make_celery
from service.domain.catalog import DEFAULT_CATALOG, Catalog
from service.logs import LogStore, open_log_store
from service.logs.config import LogSinkConfig
from service.private import private_dir, private_home
from service.runtimes import RuntimeInfo
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


# How stale a process's view of key revocations may be: the bound on how long a revoked
# key keeps working on an API process other than the one that revoked it.
REVOCATION_CHECK_SECONDS = 1.0


class KeyCache:
    """Who an API key belongs to, remembered per process: authenticating every request
    against the database would cost more than the request. Only found keys are kept, so a
    new key works at once; entries live `ttl` seconds.

    A revoked key stops working on every process within `check_every` seconds: revoking
    bumps a counter in the database, in the revoking transaction
    (`repository.bump_revocation_epoch`). A remembered key is answered only while this
    process's last look at that counter is younger than `check_every`; the first request
    after that looks again (`refresh`: one small query, made by one thread; an idle
    process makes none) and, if the counter moved, every remembered key is forgotten.
    """

    def __init__(self, ttl: float = 30.0, check_every: float = REVOCATION_CHECK_SECONDS) -> None:
        self.check_every = check_every
        self._keys: TtlCache[str, TenantRef] = TtlCache(ttl)
        self._epoch: int | None = None
        self._checked_at = -math.inf
        self._lock = threading.Lock()

    def get(self, key_hash: str) -> TenantRef | None:
        """The key's tenant, if remembered and the revocations were looked at recently;
        else None: `refresh`, then ask the database."""
        if time.monotonic() - self._checked_at >= self.check_every:
            return None
        return self._keys.get(key_hash)

    def remembered(self, key_hash: str) -> bool:
        """Whether the key was found in the last `ttl` seconds, however long ago the
        revocations were looked at (`get` answers it only after `refresh`)."""
        return self._keys.get(key_hash) is not None

    def refresh(self, read_epoch: Callable[[], int]) -> None:
        """Read the revocation counter if the last look is `check_every` old (one thread
        reads; the others wait for it), and forget every key if it moved."""
        if time.monotonic() - self._checked_at < self.check_every:
            return
        with self._lock:
            started = time.monotonic()
            if started - self._checked_at < self.check_every:
                return
            epoch = read_epoch()
            if epoch != self._epoch:
                self._keys.clear()
                self._epoch = epoch
            # As of when the read started: a revocation committed during it is seen next.
            self._checked_at = started

    @property
    def generation(self) -> int:
        """Read before looking a key up in the database; hand it to `put`."""
        return self._keys.generation

    def put(self, key_hash: str, tenant: TenantRef, generation: int) -> None:
        """Remember the key, unless keys were forgotten since `generation` was read (the
        lookup may predate a revocation)."""
        self._keys.put(key_hash, tenant, generation)

    def forget_all(self) -> None:
        """Forget every key now (this process revoked one)."""
        self._keys.clear()


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
    # request, a learner's status), so it reacts now instead of at its next pass; with
    # `monitor_urgent` when the news is not only submissions (`wake_monitor`).
    monitor_wakeup: threading.Event = field(default_factory=threading.Event)
    monitor_urgent: threading.Event = field(default_factory=threading.Event)
    # Who a key belongs to; a revoked key stops working within a second (KeyCache).
    tenant_keys: KeyCache = field(default_factory=KeyCache)
    # Whether this platform brought its database's schema up to date already: `dlaas up`
    # migrates before it serves, and its apps' start-up then has nothing to do (nor to say).
    migrated: bool = False

    @classmethod
    def from_settings(cls, settings: Settings) -> Platform:
        # Owner-only: the home holds keys, the database and logs (service.private).
        private_home(settings.home_dir)
        engine = make_engine(settings.resolved_database_url)
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

    def wake_monitor(self) -> None:
        """News a monitor in this process acts on at once: a learner's status changed, a
        stop was asked."""
        self.monitor_urgent.set()
        self.monitor_wakeup.set()

    def wake_monitor_to_admit(self) -> None:
        """A training was queued: a monitor in this process admits it now after a quiet
        spell; during a burst, at most one pass per ADMISSION_SPACING of the monitor."""
        self.monitor_wakeup.set()

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
    def session_seal(self) -> SecretBox:
        """Seals the API key a dashboard session cookie carries (service.http.auth); its
        own key, derived from the secret key, so a sealed credential is never a valid
        cookie nor a cookie a credential."""
        return SecretBox("dlaas-session:" + ensure_secret_key(self.settings))

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
    def runtime_definitions(self) -> Path:
        """Where the runtimes are defined (DLAAS_RUNTIME_DEFINITIONS_DIR, default the
        source's runtimes/)."""
        return self.settings.runtime_definitions_dir or runtimes.DEFINITIONS

    def installed_runtimes(self) -> frozenset[str]:
        """The framework runtimes installed where this platform's learners run (the local
        backend: this machine's runtimes directory; the Kubernetes backend: every defined
        one, each in its learner image; the platform's always is)."""
        if self.settings.backend == "kubernetes":
            return frozenset(runtimes.known(self.runtime_definitions))
        return runtimes.installed_names(self.settings.runtimes_path, self.runtime_definitions)

    def runtime_startable(self, name: str) -> bool:
        """Whether a submitted training may name the runtime `name`: an installed one or,
        where the operator lets the platform install a runtime on its first use
        (DLAAS_RUNTIME_AUTO_INSTALL), any defined one. Only that runtime is looked at."""
        if name == runtimes.PLATFORM:  # this installation's own: no file to look at
            return True
        if self.settings.backend == "kubernetes":
            return name in runtimes.known(self.runtime_definitions)
        if self.settings.runtime_auto_install and name in runtimes.definitions(
            self.runtime_definitions
        ):
            return True
        return self.runtime(name) is not None

    def runtime(self, name: str) -> RuntimeInfo | None:
        """The installed runtime `name`; None where it is not installed. On Kubernetes
        every defined runtime is, in its learner image."""
        if self.settings.backend == "kubernetes":
            return runtimes.in_learner_image(name, self.runtime_definitions)
        return runtimes.installed(self.settings.runtimes_path, name, self.runtime_definitions)

    def install_runtime(
        self, name: str, progress: Callable[[str], None], wait: bool = True
    ) -> RuntimeInfo:
        """Install the runtime `name` where learners find it (RuntimeBuildError if it cannot
        be built; InstallInProgress if another install holds it and not `wait`)."""
        return runtimes.install(
            name, self.settings.runtimes_path, progress, self.runtime_definitions, wait=wait
        )

    def revocation_epoch(self) -> int:
        """The key revocation counter now (one small query; see KeyCache)."""
        with self.engine.connect() as conn:
            return repository.revocation_epoch(conn)

    def migrate(self) -> None:
        """Bring the database's schema up to date, once for this platform."""
        if self.migrated:
            return
        upgrade(self.engine)
        self.migrated = True

    def close(self) -> None:
        self.engine.dispose()
