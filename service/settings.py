"""All configuration, from `DLAAS_*` environment variables.

Unset means the embedded default: everything lives under `DLAAS_HOME` (SQLite, a local
object-store directory, learner work directories) and no server has to be installed.
"""

from __future__ import annotations

from functools import cached_property
from pathlib import Path
from typing import Literal

from pydantic import Field
from pydantic_settings import BaseSettings, SettingsConfigDict


class Settings(BaseSettings):
    """One settings object for the API, the worker and the CLI's embedded server."""

    model_config = SettingsConfigDict(env_prefix="DLAAS_", extra="ignore")

    home: Path = Field(
        default=Path("~/.dlaas"),
        description="State of the embedded platform: SQLite file, object store, work dirs.",
    )
    database_url: str | None = Field(
        default=None,
        description="SQLAlchemy URL; default SQLite under DLAAS_HOME, "
        "postgresql+psycopg://... in a cluster.",
    )
    admin_api_key: str | None = Field(
        default=None,
        description="Bootstrap admin key; generated into $DLAAS_HOME/admin_api_key if unset.",
    )
    catalog_file: Path | None = Field(
        default=None,
        description="YAML file overriding the framework, compute and plan catalogs.",
    )
    max_upload_bytes: int = Field(
        default=200 * 1024 * 1024, gt=0, description="Largest accepted request body (413 above)."
    )
    archive_max_files: int = Field(default=10_000, gt=0)
    archive_max_unpacked_bytes: int = Field(default=2 * 1024**3, gt=0)
    auto_migrate: bool = Field(
        default=True, description="Run database migrations when the API starts."
    )
    broker_url: str | None = Field(
        default=None,
        description="Celery broker; default a directory under DLAAS_HOME (no server), "
        "redis://... in a cluster.",
    )
    log_store_url: str | None = Field(
        default=None,
        description="redis://... for live logs shared across machines; default the broker "
        "if it is Redis, else files under DLAAS_HOME.",
    )
    backend: Literal["local", "kubernetes"] = Field(
        default="local", description="Where learners run."
    )
    local_slots: int = Field(
        default=8, gt=0, description="Learners the local backend runs at once (gang admission)."
    )
    local_namespaces: bool | None = Field(
        default=None,
        description="Give each local learner its own network namespace; unset: when available.",
    )
    monitor_interval: float = Field(
        default=0.1, gt=0, description="Seconds between two passes of the monitor."
    )
    stop_grace_seconds: float = Field(
        default=3.0, ge=0, description="SIGTERM to SIGKILL grace when learners are stopped."
    )

    @cached_property
    def home_dir(self) -> Path:
        return self.home.expanduser().resolve()

    @property
    def resolved_database_url(self) -> str:
        if self.database_url:
            return self.database_url
        return f"sqlite:///{self.home_dir / 'dlaas.db'}"

    @property
    def object_store_dir(self) -> Path:
        return self.home_dir / "objects"

    @property
    def work_dir(self) -> Path:
        return self.home_dir / "work"

    @property
    def resolved_broker_url(self) -> str:
        return self.broker_url or "filesystem://"

    @property
    def resolved_log_store_url(self) -> str | None:
        """A Redis URL, or None for the file store under DLAAS_HOME."""
        if self.log_store_url:
            return self.log_store_url
        if self.broker_url and self.broker_url.startswith(("redis://", "rediss://")):
            return self.broker_url
        return None

    @property
    def admin_key_file(self) -> Path:
        return self.home_dir / "admin_api_key"
