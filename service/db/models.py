"""SQLAlchemy models. Every schema change ships with an Alembic migration."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from sqlalchemy import (
    JSON,
    BigInteger,
    DateTime,
    ForeignKey,
    Index,
    Integer,
    String,
    Text,
    TypeDecorator,
)
from sqlalchemy.engine import Dialect
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column, relationship


def utcnow() -> datetime:
    return datetime.now(UTC)


class UTCDateTime(TypeDecorator[datetime]):
    """Timezone-aware UTC datetimes on every database (SQLite drops the zone)."""

    impl = DateTime(timezone=True)
    cache_ok = True

    def process_bind_param(self, value: datetime | None, dialect: Dialect) -> datetime | None:
        if value is not None and value.tzinfo is None:
            raise ValueError("naive datetime stored; use timezone-aware UTC")
        return value.astimezone(UTC) if value is not None else None

    def process_result_value(self, value: datetime | None, dialect: Dialect) -> datetime | None:
        if value is not None and value.tzinfo is None:
            return value.replace(tzinfo=UTC)
        return value


class Base(DeclarativeBase):
    type_annotation_map = {datetime: UTCDateTime, dict[str, Any]: JSON}


class Tenant(Base):
    __tablename__ = "tenants"

    id: Mapped[str] = mapped_column(String(32), primary_key=True)
    name: Mapped[str] = mapped_column(String(128), unique=True)
    plan: Mapped[str] = mapped_column(String(32))
    created_at: Mapped[datetime] = mapped_column(default=utcnow)


class ApiKey(Base):
    __tablename__ = "api_keys"

    id: Mapped[str] = mapped_column(String(32), primary_key=True)
    tenant_id: Mapped[str] = mapped_column(ForeignKey("tenants.id", ondelete="CASCADE"), index=True)
    # sha256 of the key: keys are 256-bit random, so a fast hash is as good as a slow one.
    key_hash: Mapped[str] = mapped_column(String(64), unique=True)
    prefix: Mapped[str] = mapped_column(String(16))
    created_at: Mapped[datetime] = mapped_column(default=utcnow)
    # When the key was last seen authenticating, to the minute: written at most once a
    # minute (service.tenants.record_use), not on every request.
    last_used_at: Mapped[datetime | None] = mapped_column(default=None)
    # Revoked keys keep their row (who had which key, and when it stopped working).
    revoked_at: Mapped[datetime | None] = mapped_column(default=None)


class KeyRevocations(Base):
    """One row (id 1): a counter bumped by every key revocation, in the revoking
    transaction. Each API process reads it at most once a second and forgets the keys it
    remembers when it moved (service.platform.KeyCache)."""

    __tablename__ = "key_revocations"

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=False)
    epoch: Mapped[int] = mapped_column(Integer)


class Training(Base):
    __tablename__ = "trainings"
    __table_args__ = (
        # GET /v1/trainings: a tenant's trainings, newest first, optionally by status.
        Index("ix_trainings_tenant_created", "tenant_id", "created_at", "id"),
        Index("ix_trainings_tenant_status_created", "tenant_id", "status", "created_at", "id"),
        # Admission looks for the oldest QUEUED trainings.
        Index("ix_trainings_status_created", "status", "created_at"),
    )

    id: Mapped[str] = mapped_column(String(32), primary_key=True)
    tenant_id: Mapped[str] = mapped_column(ForeignKey("tenants.id", ondelete="CASCADE"))
    name: Mapped[str] = mapped_column(String(128))
    description: Mapped[str | None] = mapped_column(Text, default=None)
    status: Mapped[str] = mapped_column(String(16))
    status_message: Mapped[str | None] = mapped_column(Text, default=None)
    # What the backend could not enforce as the compute configuration asks on this
    # machine (resource limits, isolation): said once, here, not in status messages.
    limits_note: Mapped[str | None] = mapped_column(Text, default=None)
    framework_name: Mapped[str] = mapped_column(String(64))
    framework_version: Mapped[str] = mapped_column(String(32))
    compute_name: Mapped[str] = mapped_column(String(64))
    nodes: Mapped[int] = mapped_column(Integer)
    manifest: Mapped[dict[str, Any]] = mapped_column()
    # The manifest as submitted (its format's own document, FfDL's say), credentials
    # masked; `manifest` is what it was translated to. None: submitted before it was kept.
    submitted_manifest: Mapped[dict[str, Any] | None] = mapped_column(JSON, default=None)
    model_definition_key: Mapped[str] = mapped_column(String(512))
    # Bytes stored for it, what the plan's max_stored_bytes counts: the code archive (at
    # submission) and the results (at the end, learners' logs included).
    code_bytes: Mapped[int] = mapped_column(BigInteger, default=0, server_default="0")
    results_bytes: Mapped[int] = mapped_column(BigInteger, default=0, server_default="0")
    # CHECKPOINT_DIR as last saved (at the end of each attempt), counted with them.
    checkpoint_bytes: Mapped[int] = mapped_column(BigInteger, default=0, server_default="0")
    # The attempt running (1, then one more per retry), and the attempts before it as
    # they ended: [{attempt, started_at, ended_at, message, learners: [{learner_id,
    # status, exit_code, status_message}]}].
    attempt: Mapped[int] = mapped_column(Integer, default=1, server_default="1")
    past_attempts: Mapped[list[dict[str, Any]] | None] = mapped_column(JSON, default=None)
    # Intent written by the API, acted on by the worker/monitor (data flows one way).
    stop_requested_at: Mapped[datetime | None] = mapped_column(default=None)
    delete_requested_at: Mapped[datetime | None] = mapped_column(default=None)
    created_at: Mapped[datetime] = mapped_column(default=utcnow)
    updated_at: Mapped[datetime] = mapped_column(default=utcnow, onupdate=utcnow)
    started_at: Mapped[datetime | None] = mapped_column(default=None)
    completed_at: Mapped[datetime | None] = mapped_column(default=None)

    learners: Mapped[list[Learner]] = relationship(
        back_populates="training",
        cascade="all, delete-orphan",
        order_by="Learner.learner_id",
        lazy="selectin",
    )
    events: Mapped[list[StatusEvent]] = relationship(
        cascade="all, delete-orphan", order_by="StatusEvent.id", lazy="selectin"
    )


class Learner(Base):
    __tablename__ = "learners"

    training_id: Mapped[str] = mapped_column(
        ForeignKey("trainings.id", ondelete="CASCADE"), primary_key=True
    )
    learner_id: Mapped[int] = mapped_column(Integer, primary_key=True)
    status: Mapped[str] = mapped_column(String(16))
    exit_code: Mapped[int | None] = mapped_column(default=None)
    status_message: Mapped[str | None] = mapped_column(Text, default=None)
    updated_at: Mapped[datetime] = mapped_column(default=utcnow, onupdate=utcnow)

    training: Mapped[Training] = relationship(back_populates="learners")


class StatusEvent(Base):
    """One recorded transition of a training (its status_history)."""

    __tablename__ = "status_events"

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    training_id: Mapped[str] = mapped_column(
        ForeignKey("trainings.id", ondelete="CASCADE"), index=True
    )
    status: Mapped[str] = mapped_column(String(16))
    message: Mapped[str | None] = mapped_column(Text, default=None)
    at: Mapped[datetime] = mapped_column(default=utcnow)
    attempt: Mapped[int] = mapped_column(Integer, default=1, server_default="1")


class Deployment(Base):
    """A trained model served for online scoring (POST /v1/deployments)."""

    __tablename__ = "deployments"
    __table_args__ = (
        # GET /v1/deployments: a tenant's deployments, newest first.
        Index("ix_deployments_tenant_created", "tenant_id", "created_at", "id"),
        # Scoring processes look for deployments still DEPLOYING.
        Index("ix_deployments_status", "status"),
        # TensorFlow Serving's paths and the gRPC API address a model by its name.
        Index("uq_deployments_tenant_name", "tenant_id", "name", unique=True),
    )

    id: Mapped[str] = mapped_column(String(32), primary_key=True)
    tenant_id: Mapped[str] = mapped_column(ForeignKey("tenants.id", ondelete="CASCADE"))
    # No foreign key: a deployment serves its own copy of the model (model_key) and outlives
    # the training it came from.
    training_id: Mapped[str] = mapped_column(String(32))
    name: Mapped[str] = mapped_column(String(128))
    status: Mapped[str] = mapped_column(String(16))
    status_message: Mapped[str | None] = mapped_column(Text, default=None)
    # The SavedModel's signatures once loaded: {"signatures": {name: {inputs, outputs}}}.
    signatures: Mapped[dict[str, Any] | None] = mapped_column(default=None)
    model_key: Mapped[str] = mapped_column(String(512))
    created_at: Mapped[datetime] = mapped_column(default=utcnow)
    updated_at: Mapped[datetime] = mapped_column(default=utcnow, onupdate=utcnow)
    ready_at: Mapped[datetime | None] = mapped_column(default=None)


class DeploymentVersion(Base):
    """One numbered version of a deployment: a SavedModel of some training, served by a
    model process of its own while READY (service.domain.versions)."""

    __tablename__ = "deployment_versions"

    deployment_id: Mapped[str] = mapped_column(
        ForeignKey("deployments.id", ondelete="CASCADE"), primary_key=True
    )
    version: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=False)
    training_id: Mapped[str] = mapped_column(String(32))
    # Where the SavedModel came from (a prefix of the training's results; '' for the
    # training's model/, the version 1 of a deployment made before versions) and where the
    # deployment's own copy is.
    source_key: Mapped[str] = mapped_column(String(512))
    model_key: Mapped[str] = mapped_column(String(512))
    state: Mapped[str] = mapped_column(String(16))
    status_message: Mapped[str | None] = mapped_column(Text, default=None)
    signatures: Mapped[dict[str, Any] | None] = mapped_column(default=None)
    created_at: Mapped[datetime] = mapped_column(default=utcnow)
    updated_at: Mapped[datetime] = mapped_column(default=utcnow, onupdate=utcnow)
    loaded_at: Mapped[datetime | None] = mapped_column(default=None)
    unloaded_at: Mapped[datetime | None] = mapped_column(default=None)


class DeploymentLabel(Base):
    """A name (`stable`, `canary`, ...) that points at a loaded version of a deployment."""

    __tablename__ = "deployment_labels"

    deployment_id: Mapped[str] = mapped_column(
        ForeignKey("deployments.id", ondelete="CASCADE"), primary_key=True
    )
    label: Mapped[str] = mapped_column(String(64), primary_key=True)
    version: Mapped[int] = mapped_column(Integer)
    updated_at: Mapped[datetime] = mapped_column(default=utcnow, onupdate=utcnow)
