"""Every query the service runs, in one place."""

from __future__ import annotations

import base64
import json
from collections.abc import Collection, Sequence
from dataclasses import dataclass, fields
from datetime import datetime
from typing import Any, TypeVar

from sqlalchemy import Connection, and_, bindparam, case, func, or_, select, text, update
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.orm import Session, lazyload

from service.db.models import (
    ApiKey,
    Deployment,
    DeploymentLabel,
    DeploymentVersion,
    KeyRevocations,
    Learner,
    StatusEvent,
    Tenant,
    Training,
    utcnow,
)
from service.domain.admission import Candidate
from service.domain.deployments import DeploymentState
from service.domain.states import ACTIVE_STATES, TrainingState
from service.domain.versions import VersionState


def ping(conn: Connection) -> None:
    """A round trip to the database (readiness); raises SQLAlchemyError if it fails."""
    conn.execute(text("SELECT 1"))


def tenant_for_key_hash(session: Session, key_hash: str) -> Tenant | None:
    stmt = (
        select(Tenant)
        .join(ApiKey, ApiKey.tenant_id == Tenant.id)
        .where(ApiKey.key_hash == key_hash, ApiKey.revoked_at.is_(None))
    )
    return session.scalars(stmt).first()


def active_key_for_hash(session: Session, key_hash: str) -> tuple[ApiKey, Tenant] | None:
    """The unrevoked key of that hash and its tenant."""
    stmt = (
        select(ApiKey, Tenant)
        .join(Tenant, ApiKey.tenant_id == Tenant.id)
        .where(ApiKey.key_hash == key_hash, ApiKey.revoked_at.is_(None))
    )
    row = session.execute(stmt).first()
    return None if row is None else (row[0], row[1])


def tenant_keys(session: Session, tenant_id: str) -> Sequence[ApiKey]:
    """The tenant's keys, revoked ones too, oldest first."""
    stmt = select(ApiKey).where(ApiKey.tenant_id == tenant_id)
    return session.scalars(stmt.order_by(ApiKey.created_at, ApiKey.id)).all()


def tenant_key(session: Session, tenant_id: str, key_id: str) -> ApiKey | None:
    """The tenant's key of that id (another tenant's is None)."""
    stmt = select(ApiKey).where(ApiKey.id == key_id, ApiKey.tenant_id == tenant_id)
    return session.scalars(stmt).first()


def active_key_count(session: Session, tenant_id: str) -> int:
    stmt = select(func.count()).where(ApiKey.tenant_id == tenant_id, ApiKey.revoked_at.is_(None))
    return int(session.scalar(stmt) or 0)


def touch_key(session: Session, key_id: str, now: datetime, older_than: datetime) -> None:
    """Set the key's last_used_at to `now` unless it was set at `older_than` or later (a
    process that was beaten to it by another writes nothing)."""
    session.execute(
        update(ApiKey)
        .where(
            ApiKey.id == key_id,
            or_(ApiKey.last_used_at.is_(None), ApiKey.last_used_at < older_than),
        )
        .values(last_used_at=now)
        .execution_options(synchronize_session=False)
    )


_EPOCH_ROW = 1


def revocation_epoch(conn: Connection) -> int:
    """The key revocation counter (0 before the first revocation)."""
    stmt = select(KeyRevocations.epoch).where(KeyRevocations.id == _EPOCH_ROW)
    return int(conn.execute(stmt).scalar() or 0)


def bump_revocation_epoch(session: Session) -> None:
    """Add one to the key revocation counter (creating its row), in the caller's
    transaction."""
    dialect = session.get_bind().dialect.name
    insert = postgresql.insert if dialect == "postgresql" else sqlite.insert
    stmt = insert(KeyRevocations).values(id=_EPOCH_ROW, epoch=1)
    session.execute(
        stmt.on_conflict_do_update(
            index_elements=[KeyRevocations.id], set_={"epoch": KeyRevocations.epoch + 1}
        )
    )


def get_tenant(session: Session, tenant_id: str) -> Tenant | None:
    return session.get(Tenant, tenant_id)


def tenant_by_name(session: Session, name: str) -> Tenant | None:
    return session.scalars(select(Tenant).where(Tenant.name == name)).first()


def tenant_name_of(session: Session, tenant_id: str) -> str | None:
    return session.scalars(select(Tenant.name).where(Tenant.id == tenant_id)).first()


def list_tenants(session: Session) -> Sequence[Tenant]:
    return session.scalars(select(Tenant).order_by(Tenant.created_at, Tenant.id)).all()


def plans_of_tenants(session: Session, tenant_ids: Collection[str]) -> dict[str, str]:
    """Each tenant's plan name, by tenant id (tenants that do not exist are left out)."""
    stmt = select(Tenant.id, Tenant.plan).where(Tenant.id.in_(tenant_ids))
    return {tenant_id: plan for tenant_id, plan in session.execute(stmt)}


def get_training(session: Session, tenant_id: str, training_id: str) -> Training | None:
    stmt = select(Training).where(Training.id == training_id, Training.tenant_id == tenant_id)
    return session.scalars(stmt).first()


def training_by_id(session: Session, training_id: str) -> Training | None:
    """Any tenant's training (the worker's and the monitor's view; the API asks with
    `get_training`, which checks the owner)."""
    return session.get(Training, training_id)


def deployment_by_id(session: Session, deployment_id: str) -> Deployment | None:
    """Any tenant's deployment (the scoring service's view; the API asks with
    `get_deployment`, which checks the owner)."""
    return session.get(Deployment, deployment_id)


def try_advisory_lock(conn: Connection, lock_id: int) -> bool:
    """Take PostgreSQL's session-level advisory lock `lock_id` if no other session holds
    it; held until the connection closes."""
    got = conn.execute(text("SELECT pg_try_advisory_lock(:id)"), {"id": lock_id}).scalar()
    conn.commit()
    return bool(got)


def active_trainings(session: Session) -> Sequence[Training]:
    """The trainings in an active state (ACTIVE_STATES), oldest first, with their
    learners. Their status history is not loaded: it is only appended to, on a
    transition, and loaded then if ever."""
    stmt = (
        select(Training)
        .where(Training.status.in_(ACTIVE_STATES))
        .order_by(Training.created_at)
        .options(lazyload(Training.events))
    )
    return session.scalars(stmt).all()


def active_trainings_among(
    session: Session, training_ids: Collection[str], touched_since: datetime
) -> Sequence[Training]:
    """The active trainings among `training_ids`, and those written since `touched_since`
    (their updated_at: a stop request, a launch's progress, a transition), oldest first,
    as `active_trainings` loads them: what a monitor pass between two full ones reconciles."""
    touched = Training.updated_at >= touched_since
    wanted = or_(Training.id.in_(training_ids), touched) if training_ids else touched
    stmt = (
        select(Training)
        .where(Training.status.in_(ACTIVE_STATES), wanted)
        .order_by(Training.created_at)
        .options(lazyload(Training.events))
    )
    return session.scalars(stmt).all()


@dataclass(frozen=True)
class ActiveLoad:
    """What the active trainings hold, per tenant: trainings and learners (nodes)."""

    trainings: dict[str, int]
    nodes: dict[str, int]

    @property
    def total_nodes(self) -> int:
        return sum(self.nodes.values())


def active_load(session: Session) -> ActiveLoad:
    """The active trainings per tenant, and the learners (nodes) they hold: what admission
    weighs, counted by the database rather than by loading every training."""
    stmt = (
        select(Training.tenant_id, func.count(), func.coalesce(func.sum(Training.nodes), 0))
        .where(Training.status.in_(ACTIVE_STATES))
        .group_by(Training.tenant_id)
    )
    trainings: dict[str, int] = {}
    nodes: dict[str, int] = {}
    for tenant_id, count, tenant_nodes in session.execute(stmt):
        trainings[tenant_id] = int(count)
        nodes[tenant_id] = int(tenant_nodes)
    return ActiveLoad(trainings, nodes)


def tenant_active_nodes(session: Session, tenant_id: str) -> int:
    """The learners (nodes) the tenant's active trainings hold."""
    stmt = select(func.coalesce(func.sum(Training.nodes), 0)).where(
        Training.tenant_id == tenant_id, Training.status.in_(ACTIVE_STATES)
    )
    return int(session.scalar(stmt) or 0)


def set_queued_messages(session: Session, messages: dict[str, str], clear_prefix: str) -> None:
    """Set the status_message of these QUEUED trainings (id: message) where it differs, and
    clear, on every other QUEUED training, a message starting with `clear_prefix` (one that
    no longer holds). One UPDATE per distinct message: the monitor calls it every pass."""
    by_message: dict[str, list[str]] = {}
    for training_id, message in messages.items():
        by_message.setdefault(message, []).append(training_id)
    queued = Training.status == TrainingState.QUEUED
    for message, ids in by_message.items():
        session.execute(
            update(Training)
            .where(
                queued,
                Training.id.in_(ids),
                or_(Training.status_message.is_(None), Training.status_message != message),
            )
            .values(status_message=message)
            .execution_options(synchronize_session=False)
        )
    stale = [queued, Training.status_message.startswith(clear_prefix, autoescape=True)]
    if messages:
        stale.append(Training.id.not_in(list(messages)))
    session.execute(
        update(Training)
        .where(*stale)
        .values(status_message=None)
        .execution_options(synchronize_session=False)
    )


def active_training_ids(session: Session) -> Sequence[str]:
    """The ids of the trainings in an active state (ACTIVE_STATES)."""
    return session.scalars(select(Training.id).where(Training.status.in_(ACTIVE_STATES))).all()


def queued_candidates(session: Session) -> list[Candidate]:
    """What admission needs of each QUEUED training (id, tenant, learners), in the order
    they were submitted (the admission order): rows, not ORM objects. The monitor asks on
    every pass, and a pass follows every submission; loading 300 queued trainings as
    objects cost it 44 ms of CPU (in the API's process, when embedded), these rows 3 ms."""
    stmt = (
        select(Training.id, Training.tenant_id, Training.nodes, Training.compute_name)
        .where(Training.status == TrainingState.QUEUED)
        .order_by(Training.created_at, Training.id)
    )
    return [Candidate(*row) for row in session.execute(stmt)]


def starting_candidates(session: Session) -> list[Candidate]:
    """The trainings admitted whose learners may not all be placed yet (PENDING,
    DOWNLOADING; a RUNNING one's learners run), as admission weighs them: what a backend
    that packs learners onto its nodes counts as taken besides what it sees placed."""
    starting = (TrainingState.PENDING, TrainingState.DOWNLOADING)
    stmt = select(Training.id, Training.tenant_id, Training.nodes, Training.compute_name).where(
        Training.status.in_(starting)
    )
    return [Candidate(*row) for row in session.execute(stmt)]


def queued_trainings_among(session: Session, training_ids: Collection[str]) -> Sequence[Training]:
    """Those of these trainings that are still QUEUED, in the order they were submitted."""
    if not training_ids:
        return []
    stmt = (
        select(Training)
        .where(Training.id.in_(training_ids), Training.status == TrainingState.QUEUED)
        .order_by(Training.created_at, Training.id)
    )
    return session.scalars(stmt).all()


_ENDED = (TrainingState.COMPLETED, TrainingState.FAILED, TrainingState.HALTED)


def training_statuses(session: Session, training_ids: Collection[str]) -> dict[str, str]:
    """The status of each of these trainings that exists."""
    if not training_ids:
        return {}
    rows = session.execute(
        select(Training.id, Training.status).where(Training.id.in_(list(training_ids)))
    )
    return {row.id: row.status for row in rows}


def trainings_to_delete(session: Session) -> Sequence[Training]:
    """Ended trainings whose deletion was requested while their learners ran."""
    stmt = select(Training).where(
        Training.delete_requested_at.is_not(None), Training.status.in_(_ENDED)
    )
    return session.scalars(stmt).all()


@dataclass(frozen=True, slots=True)
class TrainingView:
    """A training as the API shows it, without ORM objects (see `training_view`)."""

    id: str
    name: str
    description: str | None
    status: str
    status_message: str | None
    limits_note: str | None
    framework_name: str
    framework_version: str
    compute_name: str
    nodes: int
    manifest: dict[str, Any]
    submitted_manifest: dict[str, Any] | None
    stop_requested_at: datetime | None
    delete_requested_at: datetime | None
    created_at: datetime
    started_at: datetime | None
    completed_at: datetime | None
    attempt: int
    past_attempts: list[dict[str, Any]] | None
    learners: Sequence[Any]  # rows: learner_id, status, exit_code, status_message
    events: Sequence[Any]  # rows: status, at, message, attempt


_VIEW_COLUMNS = [f.name for f in fields(TrainingView) if f.name not in ("learners", "events")]
# Built once: constructing and compiling a statement costs more than SQLite running it.
_VIEW_SELECT = select(*(Training.__table__.c[name] for name in _VIEW_COLUMNS))
_VIEW_TRAINING = _VIEW_SELECT.where(
    Training.id == bindparam("training_id"), Training.tenant_id == bindparam("tenant_id")
)
_VIEW_LEARNERS = (
    select(Learner.learner_id, Learner.status, Learner.exit_code, Learner.status_message)
    .where(Learner.training_id == bindparam("training_id"))
    .order_by(Learner.learner_id)
)
_VIEW_EVENTS = (
    select(StatusEvent.status, StatusEvent.at, StatusEvent.message, StatusEvent.attempt)
    .where(StatusEvent.training_id == bindparam("training_id"))
    .order_by(StatusEvent.id)
)


def training_view(conn: Connection, tenant_id: str, training_id: str) -> TrainingView | None:
    """The tenant's training with its learners and status history, read with three
    prepared Core queries: what every client polling a training asks for, at about a sixth
    of the cost of loading the ORM objects (`get_training`)."""
    args = {"training_id": training_id, "tenant_id": tenant_id}
    row = conn.execute(_VIEW_TRAINING, args).first()
    if row is None:
        return None
    return TrainingView(
        **row._asdict(),
        learners=conn.execute(_VIEW_LEARNERS, args).all(),
        events=conn.execute(_VIEW_EVENTS, args).all(),
    )


_TRAINING_STATUS = select(Training.status).where(
    Training.id == bindparam("training_id"), Training.tenant_id == bindparam("tenant_id")
)


def training_status(conn: Connection, tenant_id: str, training_id: str) -> str | None:
    """The tenant's training's status, or None if the tenant has no such training: one
    prepared Core query, what a log follower asks while it waits."""
    args = {"training_id": training_id, "tenant_id": tenant_id}
    row = conn.execute(_TRAINING_STATUS, args).first()
    return None if row is None else str(row[0])


def encode_cursor(created_at: datetime, training_id: str) -> str:
    raw = json.dumps([created_at.isoformat(), training_id]).encode()
    return base64.urlsafe_b64encode(raw).decode().rstrip("=")


def decode_cursor(cursor: str) -> tuple[datetime, str]:
    """Raises ValueError on anything that is not a cursor this service produced."""
    try:
        raw = base64.urlsafe_b64decode(cursor + "=" * (-len(cursor) % 4))
        created, training_id = json.loads(raw)
        return datetime.fromisoformat(created), str(training_id)
    except Exception as e:
        raise ValueError("invalid cursor") from e


def list_training_views(
    conn: Connection,
    tenant_id: str,
    *,
    status: str | None,
    limit: int,
    cursor: str | None,
) -> tuple[list[TrainingView], str | None]:
    """A page of the tenant's trainings, newest first, and the cursor of the next page:
    three statements (the page, its learners, its histories), no ORM objects."""
    stmt = _VIEW_SELECT.where(Training.tenant_id == tenant_id)
    if status is not None:
        stmt = stmt.where(Training.status == status)
    if cursor is not None:
        created, last_id = decode_cursor(cursor)
        stmt = stmt.where(
            or_(
                Training.created_at < created,
                and_(Training.created_at == created, Training.id < last_id),
            )
        )
    stmt = stmt.order_by(Training.created_at.desc(), Training.id.desc()).limit(limit + 1)
    rows = conn.execute(stmt).all()
    page = rows[:limit]
    ids = [r.id for r in page]
    learners: dict[str, list[Any]] = {i: [] for i in ids}
    events: dict[str, list[Any]] = {i: [] for i in ids}
    if ids:
        for lr in conn.execute(
            select(
                Learner.training_id,
                Learner.learner_id,
                Learner.status,
                Learner.exit_code,
                Learner.status_message,
            )
            .where(Learner.training_id.in_(ids))
            .order_by(Learner.training_id, Learner.learner_id)
        ):
            learners[lr.training_id].append(lr)
        for ev in conn.execute(
            select(
                StatusEvent.training_id,
                StatusEvent.status,
                StatusEvent.at,
                StatusEvent.message,
                StatusEvent.attempt,
            )
            .where(StatusEvent.training_id.in_(ids))
            .order_by(StatusEvent.id)
        ):
            events[ev.training_id].append(ev)
    views = [
        TrainingView(**r._asdict(), learners=learners[r.id], events=events[r.id]) for r in page
    ]
    next_cursor = encode_cursor(page[-1].created_at, page[-1].id) if len(rows) > limit else None
    return views, next_cursor


def tenant_training_count(session: Session, tenant_id: str, *statuses: str) -> int:
    """How many of the tenant's trainings are in one of `statuses`."""
    stmt = select(func.count()).where(
        Training.tenant_id == tenant_id, Training.status.in_(statuses)
    )
    return int(session.scalar(stmt) or 0)


def tenant_stored_bytes(session: Session, tenant_id: str) -> int:
    """The bytes stored for the tenant's trainings: code archives, results and saved
    checkpoints."""
    stored = Training.code_bytes + Training.results_bytes + Training.checkpoint_bytes
    stmt = select(func.coalesce(func.sum(stored), 0)).where(Training.tenant_id == tenant_id)
    return int(session.scalar(stmt) or 0)


def tenant_queued_and_stored(session: Session, tenant_id: str) -> tuple[int, int]:
    """(tenant_training_count of QUEUED, tenant_stored_bytes) in one statement: what a
    submission checks against the plan, one round trip instead of two."""
    stored = Training.code_bytes + Training.results_bytes + Training.checkpoint_bytes
    queued = case((Training.status == TrainingState.QUEUED, 1), else_=0)
    stmt = select(func.coalesce(func.sum(queued), 0), func.coalesce(func.sum(stored), 0)).where(
        Training.tenant_id == tenant_id
    )
    row = session.execute(stmt).one()
    return int(row[0]), int(row[1])


def tenant_deployment_count(session: Session, tenant_id: str) -> int:
    """How many deployments the tenant keeps (whatever their status)."""
    stmt = select(func.count()).where(Deployment.tenant_id == tenant_id)
    return int(session.scalar(stmt) or 0)


def get_deployment(session: Session, tenant_id: str, deployment_id: str) -> Deployment | None:
    stmt = select(Deployment).where(
        Deployment.id == deployment_id, Deployment.tenant_id == tenant_id
    )
    return session.scalars(stmt).first()


def deployment_named(session: Session, tenant_id: str, name: str) -> Deployment | None:
    """The tenant's deployment called `name` (names are unique per tenant)."""
    stmt = select(Deployment).where(Deployment.tenant_id == tenant_id, Deployment.name == name)
    return session.scalars(stmt.order_by(Deployment.created_at)).first()


def list_deployments(session: Session, tenant_id: str) -> Sequence[Deployment]:
    """The tenant's deployments, newest first."""
    stmt = (
        select(Deployment)
        .where(Deployment.tenant_id == tenant_id)
        .order_by(Deployment.created_at.desc(), Deployment.id.desc())
    )
    return session.scalars(stmt).all()


def deployments_in_status(session: Session, status: str) -> Sequence[Deployment]:
    stmt = select(Deployment).where(Deployment.status == status).order_by(Deployment.created_at)
    return session.scalars(stmt).all()


def finish_deploying(
    session: Session,
    deployment_id: str,
    *,
    status: str,
    message: str | None,
    signatures: dict[str, Any] | None,
) -> bool:
    """Record how deploying ended, if the deployment is still DEPLOYING (several scoring
    processes may load the same model; the first to finish records it). Returns whether
    this call recorded it."""
    now = utcnow()
    stmt = (
        update(Deployment)
        .where(Deployment.id == deployment_id, Deployment.status == DeploymentState.DEPLOYING)
        .values(
            status=status,
            status_message=message,
            signatures=signatures,
            updated_at=now,
            ready_at=now if status == DeploymentState.READY else None,
        )
    )
    result = session.execute(stmt)
    return bool(getattr(result, "rowcount", 0))


def note_deployment(session: Session, deployment_id: str, message: str) -> bool:
    """Set a READY deployment's status_message (what happened to its model process);
    returns whether it was READY."""
    stmt = (
        update(Deployment)
        .where(Deployment.id == deployment_id, Deployment.status == DeploymentState.READY)
        .values(status_message=message, updated_at=utcnow())
    )
    result = session.execute(stmt)
    return bool(getattr(result, "rowcount", 0))


# ---- deployment versions and labels ----


def lock_deployment(session: Session, deployment_id: str) -> Deployment | None:
    """The deployment, its row locked until the transaction ends (on PostgreSQL), so that
    two requests changing its versions or labels at once take turns."""
    stmt = select(Deployment).where(Deployment.id == deployment_id).with_for_update()
    return session.scalars(stmt).first()


def deployment_versions(session: Session, deployment_id: str) -> Sequence[DeploymentVersion]:
    stmt = (
        select(DeploymentVersion)
        .where(DeploymentVersion.deployment_id == deployment_id)
        .order_by(DeploymentVersion.version)
    )
    return session.scalars(stmt).all()


def deployment_labels(session: Session, deployment_id: str) -> Sequence[DeploymentLabel]:
    stmt = (
        select(DeploymentLabel)
        .where(DeploymentLabel.deployment_id == deployment_id)
        .order_by(DeploymentLabel.label)
    )
    return session.scalars(stmt).all()


_Row = TypeVar("_Row", DeploymentVersion, DeploymentLabel)


def versions_of(
    session: Session, deployment_ids: Collection[str]
) -> dict[str, list[DeploymentVersion]]:
    """Each deployment's versions, by number (one query for a page of deployments)."""
    return _by_deployment(session, DeploymentVersion, deployment_ids, DeploymentVersion.version)


def labels_of(
    session: Session, deployment_ids: Collection[str]
) -> dict[str, list[DeploymentLabel]]:
    """Each deployment's labels, by name (one query for a page of deployments)."""
    return _by_deployment(session, DeploymentLabel, deployment_ids, DeploymentLabel.label)


def _by_deployment(
    session: Session, model: type[_Row], deployment_ids: Collection[str], order: Any
) -> dict[str, list[_Row]]:
    """The rows of `model` (a table keyed by deployment_id) of each deployment, in `order`."""
    found: dict[str, list[_Row]] = {d: [] for d in deployment_ids}
    if not deployment_ids:
        return found
    column = model.deployment_id
    stmt = select(model).where(column.in_(list(deployment_ids))).order_by(column, order)
    for row in session.scalars(stmt):
        found[row.deployment_id].append(row)
    return found


def deploying_versions(session: Session) -> Sequence[DeploymentVersion]:
    """Versions to load: DEPLOYING, of deployments being deployed or serving."""
    stmt = (
        select(DeploymentVersion)
        .join(Deployment, Deployment.id == DeploymentVersion.deployment_id)
        .where(
            DeploymentVersion.state == VersionState.DEPLOYING,
            Deployment.status.in_([DeploymentState.DEPLOYING, DeploymentState.READY]),
        )
        .order_by(DeploymentVersion.created_at)
    )
    return session.scalars(stmt).all()


def serving_versions(session: Session) -> Sequence[DeploymentVersion]:
    """The loaded versions of READY deployments: what scoring processes keep loaded."""
    stmt = (
        select(DeploymentVersion)
        .join(Deployment, Deployment.id == DeploymentVersion.deployment_id)
        .where(
            DeploymentVersion.state == VersionState.READY,
            Deployment.status == DeploymentState.READY,
        )
        .order_by(DeploymentVersion.created_at)
    )
    return session.scalars(stmt).all()


def deployment_version(
    session: Session, deployment_id: str, version: int
) -> DeploymentVersion | None:
    return session.get(DeploymentVersion, (deployment_id, version))


def finish_version(
    session: Session,
    deployment_id: str,
    version: int,
    *,
    state: str,
    message: str | None,
    signatures: dict[str, Any] | None,
) -> bool:
    """Record how loading a version ended, if it is still DEPLOYING (the first scoring
    process to finish records it). Returns whether this call recorded it."""
    now = utcnow()
    stmt = (
        update(DeploymentVersion)
        .where(
            DeploymentVersion.deployment_id == deployment_id,
            DeploymentVersion.version == version,
            DeploymentVersion.state == VersionState.DEPLOYING,
        )
        .values(
            state=state,
            status_message=message,
            signatures=signatures,
            updated_at=now,
            loaded_at=now if state == VersionState.READY else None,
        )
    )
    result = session.execute(stmt)
    return bool(getattr(result, "rowcount", 0))


def note_version(session: Session, deployment_id: str, version: int, message: str) -> None:
    """Set a READY version's status_message (what happened to its model process)."""
    session.execute(
        update(DeploymentVersion)
        .where(
            DeploymentVersion.deployment_id == deployment_id,
            DeploymentVersion.version == version,
            DeploymentVersion.state == VersionState.READY,
        )
        .values(status_message=message, updated_at=utcnow())
    )


def set_label(session: Session, deployment_id: str, label: str, version: int) -> DeploymentLabel:
    """Point the label at the version (created, or moved)."""
    row = session.get(DeploymentLabel, (deployment_id, label))
    if row is None:
        row = DeploymentLabel(deployment_id=deployment_id, label=label, version=version)
        session.add(row)
    else:
        row.version = version
        row.updated_at = utcnow()
    session.flush()
    return row


def delete_label(session: Session, deployment_id: str, label: str) -> bool:
    row = session.get(DeploymentLabel, (deployment_id, label))
    if row is None:
        return False
    session.delete(row)
    session.flush()
    return True
