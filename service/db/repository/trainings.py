"""Trainings read whole (as ORM objects) and what the monitor and admission ask on every
pass: the active trainings and their load, the queued candidates, their messages, and the
ended trainings left to delete."""

from __future__ import annotations

from collections.abc import Collection, Iterator, Sequence
from dataclasses import dataclass
from datetime import datetime

from sqlalchemy import and_, func, or_, select, update
from sqlalchemy.orm import Session, lazyload

from service.db.models import Training
from service.domain.admission import Candidate
from service.domain.states import ACTIVE_STATES, TrainingState


def get_training(session: Session, tenant_id: str, training_id: str) -> Training | None:
    stmt = select(Training).where(Training.id == training_id, Training.tenant_id == tenant_id)
    return session.scalars(stmt).first()


def training_by_id(session: Session, training_id: str) -> Training | None:
    """Any tenant's training (the worker's and the monitor's view; the API asks with
    `get_training`, which checks the owner)."""
    return session.get(Training, training_id)


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


# Queued trainings read at a time by `queued_in_order`.
QUEUE_PAGE = 64
# What admission weighs of a training (a Candidate's fields), and the admission order.
_CANDIDATE = (Training.id, Training.tenant_id, Training.nodes, Training.compute_name)
_QUEUE_ORDER = (Training.created_at, Training.id)


def queued_candidates(session: Session) -> list[Candidate]:
    """What admission needs of every QUEUED training (id, tenant, learners, compute), in
    the order they were submitted (the admission order): rows, not ORM objects, in one
    read (a backend that fits learners onto nodes weighs every one)."""
    stmt = select(*_CANDIDATE).where(Training.status == TrainingState.QUEUED)
    return [Candidate(*row) for row in session.execute(stmt.order_by(*_QUEUE_ORDER))]


def queued_in_order(session: Session, page: int = QUEUE_PAGE) -> Iterator[Candidate]:
    """The QUEUED trainings as admission weighs them, oldest first, read `page` at a time
    as the caller goes on (by the last one read, not by offset). Admission stops at the
    first that does not fit, which on a busy platform is the first: reading the whole
    queue on every pass (one follows every submission) made the monitor's cost grow with
    what tenants had queued."""
    after: tuple[datetime, str] | None = None
    while True:
        stmt = select(*_CANDIDATE, Training.created_at).where(
            Training.status == TrainingState.QUEUED
        )
        if after is not None:
            created, last_id = after
            stmt = stmt.where(
                or_(
                    Training.created_at > created,
                    and_(Training.created_at == created, Training.id > last_id),
                )
            )
        rows = session.execute(stmt.order_by(*_QUEUE_ORDER).limit(page)).all()
        for row in rows:
            yield Candidate(row[0], row[1], row[2], row[3])
        if len(rows) < page:
            return
        after = (rows[-1][4], rows[-1][0])


def queued_above(session: Session, nodes: int) -> list[Candidate]:
    """The QUEUED trainings with more than `nodes` learners (those that may never fit),
    oldest first."""
    stmt = select(*_CANDIDATE).where(
        Training.status == TrainingState.QUEUED, Training.nodes > nodes
    )
    return [Candidate(*row) for row in session.execute(stmt.order_by(*_QUEUE_ORDER))]


def starting_candidates(session: Session) -> list[Candidate]:
    """The trainings admitted whose learners may not all be placed yet (PENDING,
    DOWNLOADING; a RUNNING one's learners run), as admission weighs them: what a backend
    that packs learners onto its nodes counts as taken besides what it sees placed."""
    starting = (TrainingState.PENDING, TrainingState.DOWNLOADING)
    stmt = select(*_CANDIDATE).where(Training.status.in_(starting))
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
