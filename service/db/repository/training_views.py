"""Trainings as the API shows them, without ORM objects: one training, its status, and
the pages of a tenant's trainings with their cursors."""

from __future__ import annotations

import base64
import json
from collections.abc import Sequence
from dataclasses import dataclass, fields
from datetime import datetime
from typing import Any

from sqlalchemy import Connection, and_, bindparam, or_, select

from service.db.models import Learner, StatusEvent, Training


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


_TRAINING_MANIFEST = select(Training.manifest).where(
    Training.id == bindparam("training_id"), Training.tenant_id == bindparam("tenant_id")
)


_LEARNER_IDS = (
    select(Learner.learner_id)
    .where(Learner.training_id == bindparam("training_id"))
    .order_by(Learner.learner_id)
)


def training_manifest_and_learners(
    conn: Connection, tenant_id: str, training_id: str
) -> tuple[dict[str, Any], list[int]] | None:
    """The tenant's training's stored manifest and its learners' ids, or None if the
    tenant has no such training: two prepared Core queries, what `GET .../metrics` needs."""
    args = {"training_id": training_id, "tenant_id": tenant_id}
    row = conn.execute(_TRAINING_MANIFEST, args).first()
    if row is None:
        return None
    learners = [int(learner) for learner in conn.execute(_LEARNER_IDS, args).scalars()]
    return dict(row[0]), learners


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
