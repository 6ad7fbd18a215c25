"""The statement that accepts a training: the plan's check and the inserts in one.

A submission used to read the tenant's usage (one round trip), then flush the training, its
learners and its first event (three more). `insert_within_plan` does it in one statement on
PostgreSQL: a data-modifying CTE reads the usage, inserts the training only if the plan
allows it, and inserts its learners and event from the inserted row. The check and the
insert see the same snapshot, so nothing can change between them within the statement.
On SQLite (no INSERT inside WITH; every statement is in-process, no round trip) the
training is inserted by an INSERT ... SELECT with the same condition, then its learners
and event.

The statements are built once, of bound parameters only, so SQLAlchemy compiles each once
(compiling the CTE took most of a submission's CPU in the API process when it was built
per call). The ORM objects the caller built are then made persistent as they are (no
second INSERT at the next flush, no SELECT to load them back): the session tracks changes
to them from here on as if they had been loaded.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Any, cast

from sqlalchemy import (
    BigInteger,
    FromClause,
    Integer,
    Table,
    bindparam,
    case,
    func,
    insert,
    select,
    true,
)
from sqlalchemy.orm import Session, make_transient_to_detached
from sqlalchemy.sql import Select

from service.db.models import Base, Learner, StatusEvent, Training
from service.domain.states import TrainingState


@dataclass(frozen=True)
class Usage:
    """What a tenant has that its plan limits: trainings QUEUED, bytes stored."""

    queued: int
    stored: int


@dataclass(frozen=True)
class PlanRoom:
    """What the plan allows: fewer QUEUED trainings than `max_queued` (this one not counted),
    and at most `max_stored` bytes once `adding` more are stored."""

    max_queued: int
    max_stored: int
    adding: int


def insert_within_plan(session: Session, training: Training, room: PlanRoom) -> Usage | None:
    """Insert `training` (built with its learners 1..nodes, all in one state, and its one
    event; not yet in the session) if the tenant's plan has room for it: one statement on
    PostgreSQL.

    Returns None once inserted (the objects are then persistent in `session`, within its
    transaction), or the tenant's usage that left no room (nothing inserted)."""
    _complete(training, *training.learners, *training.events)
    learners = [_row(lr) for lr in training.learners]
    params = _params(training, learners, room)
    if session.get_bind().dialect.name == "postgresql":
        queued, stored, event_id = session.execute(_STATEMENTS.postgresql, params).one()
    else:
        event_id = None
        if session.execute(_STATEMENTS.sqlite_training, params).first() is not None:
            session.execute(_STATEMENTS.sqlite_learners, learners)
            event_id = session.scalar(_STATEMENTS.sqlite_event, params)
        else:
            queued, stored = session.execute(_STATEMENTS.sqlite_usage, params).one()
    if event_id is None:
        return Usage(int(queued), int(stored))
    training.events[0].id = event_id
    for obj in (training, *training.learners, *training.events):
        make_transient_to_detached(obj)
    session.add(training)
    return None


def _params(training: Training, learners: list[dict[str, Any]], room: PlanRoom) -> dict[str, Any]:
    """The statements' parameters: the training's columns (t_*), its learners' (l_*, of
    their `learners` rows) and its event's (e_*), and the plan's room."""
    first = learners[0]
    uniform = {k: v for k, v in first.items() if k not in ("training_id", "learner_id")}
    if [lr["learner_id"] for lr in learners] != list(range(1, len(learners) + 1)) or any(
        {k: v for k, v in lr.items() if k not in ("training_id", "learner_id")} != uniform
        for lr in learners
    ):
        raise ValueError("a submitted training's learners are 1..nodes, all alike")
    if len(training.events) != 1:
        raise ValueError("a submitted training has exactly one event")
    (event,) = training.events
    return {
        **{f"t_{name}": value for name, value in _row(training).items()},
        **{f"l_{name}": value for name, value in uniform.items()},
        **{f"e_{name}": value for name, value in _row(event).items() if name != "id"},
        "learners": len(learners),
        "max_queued": room.max_queued,
        "max_stored": room.max_stored,
        "adding": room.adding,
    }


def _params_of(table: FromClause, prefix: str, skip: tuple[str, ...] = ()) -> list[Any]:
    """One bound parameter per column (`prefix` + its name, of its type), labelled."""
    return [
        bindparam(prefix + c.name, type_=c.type).label(c.name)
        for c in table.c
        if c.name not in skip
    ]


class _Statements:
    """The statements, built on first use."""

    @functools.cached_property
    def _usage(self) -> Select[Any]:
        """The tenant's QUEUED trainings and stored bytes (as the plan counts them)."""
        stored = Training.code_bytes + Training.results_bytes + Training.checkpoint_bytes
        queued = case((Training.status == TrainingState.QUEUED, 1), else_=0)
        return select(
            func.coalesce(func.sum(queued), 0).label("queued"),
            func.coalesce(func.sum(stored), 0).label("stored"),
        ).where(Training.tenant_id == bindparam("t_tenant_id"))

    def _training_from(self, usage: Any) -> Any:
        """INSERT the training if `usage` leaves the plan room; RETURNING its id."""
        queued, stored = usage.c.queued, usage.c.stored
        allowed = (queued < bindparam("max_queued", type_=BigInteger)) & (
            stored + bindparam("adding", type_=BigInteger)
            <= bindparam("max_stored", type_=BigInteger)
        )
        columns = _params_of(_TRAINING, "t_")
        return (
            insert(_TRAINING)
            .from_select(
                [c.name for c in columns], select(*columns).select_from(usage).where(allowed)
            )
            .returning(Training.id)
        )

    @functools.cached_property
    def postgresql(self) -> Any:
        """The plan's check and the three inserts, one statement: (queued, stored, the
        event's id or NULL when the plan had no room)."""
        usage = self._usage.cte("usage")  # read once, by the insert and by the answer
        inserted = self._training_from(usage).cte("inserted")
        numbers = (
            func.generate_series(1, bindparam("learners", type_=Integer))
            .table_valued("n")
            .render_derived(name="numbers")
        )
        learner_columns = _params_of(_LEARNER, "l_", skip=("training_id", "learner_id"))
        learners = insert(_LEARNER).from_select(
            ["training_id", "learner_id", *(c.name for c in learner_columns)],
            select(inserted.c.id, numbers.c.n, *learner_columns).select_from(
                inserted.join(numbers, true())
            ),
        )
        event_columns = _params_of(_STATUSEVENT, "e_", skip=("id", "training_id"))
        added = (
            insert(_STATUSEVENT)
            .from_select(
                ["training_id", *(c.name for c in event_columns)],
                select(inserted.c.id, *event_columns),
            )
            .returning(StatusEvent.id)
            .cte("added")
        )
        return select(usage.c.queued, usage.c.stored, select(added.c.id).scalar_subquery()).add_cte(
            learners.cte("learners")
        )

    @functools.cached_property
    def sqlite_training(self) -> Any:
        # A subquery, not a CTE: SQLite's driver opens the transaction only before a
        # statement that starts with INSERT.
        return self._training_from(self._usage.subquery("usage"))

    @functools.cached_property
    def sqlite_usage(self) -> Any:
        usage = self._usage.subquery("usage")
        return select(usage.c.queued, usage.c.stored)

    @functools.cached_property
    def sqlite_learners(self) -> Any:
        return insert(_LEARNER)

    @functools.cached_property
    def sqlite_event(self) -> Any:
        columns = {
            c.name: bindparam("e_" + c.name, type_=c.type)
            for c in StatusEvent.__table__.c
            if c.name != "id"
        }
        return insert(_STATUSEVENT).values(columns).returning(StatusEvent.id)


_STATEMENTS = _Statements()
_TRAINING = cast(Table, Training.__table__)
_LEARNER = cast(Table, Learner.__table__)
_STATUSEVENT = cast(Table, StatusEvent.__table__)


def _row(obj: Base) -> dict[str, Any]:
    """The object's column values, by column name (what is not set left out)."""
    mapper = obj.__mapper__
    return {
        prop.columns[0].name: obj.__dict__[prop.key]
        for prop in mapper.column_attrs
        if prop.key in obj.__dict__
    }


def _complete(*objs: Base) -> None:
    """Give every column attribute not set its Python-side default (or None), so that the
    objects are whole once persistent: nothing left to load back."""
    for obj in objs:
        for prop in obj.__mapper__.column_attrs:
            if prop.key in obj.__dict__:
                continue
            default = prop.columns[0].default
            if default is None:
                value = None
            elif default.is_scalar:
                value = default.arg
            elif default.is_callable:
                value = default.arg(None)  # wrapped: takes a context
            else:
                raise ValueError(f"{prop.key}: a default this insert cannot give")
            setattr(obj, prop.key, value)
