"""A submission's database work is one statement on PostgreSQL (the plan's check and the
inserts), and its code archive is stored while the manifest is checked; on SQLite and
PostgreSQL, without the HTTP layer."""

from __future__ import annotations

import io
import threading
from collections.abc import Iterator
from typing import Any, BinaryIO

import pytest
from sqlalchemy import event, func, inspect, select
from sqlalchemy.orm import Session

from service import submissions, tenants
from service.auth import TenantRef, new_id
from service.db.models import Learner, StatusEvent, Training, utcnow
from service.db.repository import PlanRoom, Usage, insert_within_plan
from service.domain.states import TrainingState
from service.errors import LimitExceeded, ValidationFailed
from service.platform import Platform
from tests.conftest import CODE_ZIP, manifest_yaml


@pytest.fixture
def tenant(session: Session, platform: Platform) -> TenantRef:
    made, _ = tenants.create_tenant(session, platform.catalog, "acme", "standard")
    session.commit()
    return TenantRef(made.id, made.name, made.plan)


def _training(tenant: TenantRef, nodes: int = 2, code_bytes: int = 100) -> Training:
    now = utcnow()
    training_id = new_id()
    training = Training(
        id=training_id,
        tenant_id=tenant.id,
        name="t",
        status=TrainingState.QUEUED,
        status_message="waiting for capacity",
        framework_name="tensorflow",
        framework_version="2.21",
        compute_name="P100",
        nodes=nodes,
        manifest={"name": "t"},
        model_definition_key=f"trainings/{training_id}/model_definition.zip",
        code_bytes=code_bytes,
        created_at=now,
        updated_at=now,
    )
    training.learners = [
        Learner(training_id=training_id, learner_id=i, status=TrainingState.QUEUED, updated_at=now)
        for i in range(1, nodes + 1)
    ]
    training.events = [
        StatusEvent(training_id=training_id, status=TrainingState.QUEUED, at=now, message="m")
    ]
    return training


def _rows(session: Session) -> tuple[int, int, int]:
    return tuple(  # type: ignore[return-value]
        session.scalar(select(func.count()).select_from(model))
        for model in (Training, Learner, StatusEvent)
    )


@pytest.fixture
def statements(platform: Platform) -> Iterator[list[str]]:
    """The SQL statements the platform's engine sends while the test runs."""
    sent: list[str] = []

    def record(_conn: Any, _cursor: Any, statement: str, *_: Any) -> None:
        sent.append(statement)

    event.listen(platform.engine, "before_cursor_execute", record)
    yield sent
    event.remove(platform.engine, "before_cursor_execute", record)


def test_the_plan_check_and_the_inserts_are_one_statement_on_postgresql(
    session: Session, platform: Platform, tenant: TenantRef, statements: list[str]
) -> None:
    statements.clear()
    with submissions.submission(
        session, platform, tenant, manifest_yaml(), io.BytesIO(CODE_ZIP)
    ) as training:
        sent = list(statements)
        session.commit()
    if platform.engine.dialect.name == "postgresql":
        assert len(sent) == 1, sent
        (one,) = sent
        for part in ("FROM trainings", "INSERT INTO trainings", "INSERT INTO learners"):
            assert part in one
        assert "INSERT INTO status_events" in one
    else:  # SQLite: the checked insert, the learners, the event (in-process, no round trip)
        tables = ["trainings", "learners", "status_events"]
        assert [s.split()[:3] for s in sent] == [["INSERT", "INTO", t] for t in tables]
    session.expire_all()
    stored = session.get(Training, training.id)
    assert stored is not None and stored.status == TrainingState.QUEUED
    assert [lr.learner_id for lr in stored.learners] == [1]
    assert [e.status for e in stored.events] == [TrainingState.QUEUED]


def test_a_training_is_inserted_whole_and_tracked_as_if_loaded(
    session: Session, tenant: TenantRef, statements: list[str]
) -> None:
    training = _training(tenant, nodes=3)
    assert insert_within_plan(session, training, PlanRoom(10, 10_000, 100)) is None
    assert all(inspect(o).persistent for o in (training, *training.learners, *training.events))
    assert not session.new and not session.dirty
    # Nothing left to load back: every column has its value (defaults included).
    statements.clear()
    assert (training.attempt, training.results_bytes, training.stop_requested_at) == (1, 0, None)
    assert training.events[0].id is not None
    assert statements == []
    session.commit()
    assert _rows(session) == (1, 3, 1)
    # Changes are tracked from here on: an UPDATE, not a second INSERT.
    training.status_message = "changed"
    training.learners[1].status = TrainingState.RUNNING
    session.commit()
    session.expire_all()
    again = session.get(Training, training.id)
    assert again is not None and again.status_message == "changed"
    assert [lr.status for lr in again.learners] == ["QUEUED", "RUNNING", "QUEUED"]
    assert [(e.status, e.message, e.attempt) for e in again.events] == [("QUEUED", "m", 1)]


@pytest.mark.parametrize(
    ("room", "inserted"),
    [
        (PlanRoom(max_queued=2, max_stored=10_000, adding=100), True),
        (PlanRoom(max_queued=1, max_stored=10_000, adding=100), False),  # one QUEUED already
        (PlanRoom(max_queued=9, max_stored=200, adding=100), True),  # 100 stored + 100 = limit
        (PlanRoom(max_queued=9, max_stored=199, adding=100), False),
    ],
)
def test_the_plan_is_checked_by_the_insert_itself(
    session: Session, tenant: TenantRef, room: PlanRoom, inserted: bool
) -> None:
    assert (
        insert_within_plan(session, _training(tenant, code_bytes=100), PlanRoom(9, 999, 100))
        is None
    )
    session.commit()
    refused = insert_within_plan(session, _training(tenant, nodes=2), room)
    session.commit()
    if inserted:
        assert refused is None
        assert _rows(session) == (2, 4, 2)
    else:
        assert refused == Usage(queued=1, stored=100)
        assert _rows(session) == (1, 2, 1)  # nothing of the refused one


def test_a_full_queue_is_refused_naming_the_limit_and_stores_nothing(
    session: Session, platform: Platform, tenant: TenantRef, monkeypatch: pytest.MonkeyPatch
) -> None:
    plan = platform.catalog.plans[tenant.plan]
    monkeypatch.setitem(
        platform.catalog.plans, tenant.plan, plan.model_copy(update={"max_queued_trainings": 1})
    )
    with submissions.submission(session, platform, tenant, manifest_yaml(), io.BytesIO(CODE_ZIP)):
        session.commit()
    with (
        pytest.raises(LimitExceeded, match="allows 1 queued trainings; you have 1") as refused,
        submissions.submission(session, platform, tenant, manifest_yaml(), io.BytesIO(CODE_ZIP)),
    ):
        pytest.fail("no training to commit")
    assert [e.field for e in refused.value.errors] == ["max_queued_trainings"]
    session.rollback()
    assert _rows(session)[0] == 1
    assert len(list(platform.store.list("trainings/"))) == 1  # the first one's archive only


@pytest.fixture
def stored(platform: Platform, monkeypatch: pytest.MonkeyPatch) -> threading.Event:
    """Set once the platform's store has taken an object (put_stream returned)."""
    done = threading.Event()
    put_stream = platform.store.put_stream

    def put(key: str, stream: BinaryIO, length: int | None = None) -> Any:
        info = put_stream(key, stream, length)
        done.set()
        return info

    monkeypatch.setattr(platform.store, "put_stream", put)
    return done


def test_the_archive_is_stored_while_the_manifest_is_checked(
    session: Session,
    platform: Platform,
    tenant: TenantRef,
    monkeypatch: pytest.MonkeyPatch,
    stored: threading.Event,
) -> None:
    """The manifest check waits here until the archive is in the store: were the archive
    stored after the check (as it was), this submission would never get there."""
    load_submitted = submissions.load_submitted

    def slow_check(*args: Any) -> Any:
        assert stored.wait(10), "the archive was not stored while the manifest was checked"
        return load_submitted(*args)

    monkeypatch.setattr(submissions, "load_submitted", slow_check)
    with submissions.submission(
        session, platform, tenant, manifest_yaml(), io.BytesIO(CODE_ZIP)
    ) as training:
        session.commit()
    assert platform.store.stat(training.model_definition_key) is not None


def test_a_refused_manifest_removes_the_archive_stored_meanwhile(
    session: Session,
    platform: Platform,
    tenant: TenantRef,
    monkeypatch: pytest.MonkeyPatch,
    stored: threading.Event,
) -> None:
    def refused_after_the_upload(*_: Any) -> Any:
        assert stored.wait(10)
        raise ValidationFailed([])

    monkeypatch.setattr(submissions, "load_submitted", refused_after_the_upload)
    with (
        pytest.raises(ValidationFailed),
        submissions.submission(session, platform, tenant, manifest_yaml(), io.BytesIO(CODE_ZIP)),
    ):
        pytest.fail("no training to commit")
    assert list(platform.store.list("trainings/")) == []
    assert _rows(session) == (0, 0, 0)


def test_the_statements_are_compiled_once(
    session: Session, platform: Platform, tenant: TenantRef
) -> None:
    """Built of bound parameters only: the second submission reuses the first one's
    compiled statements (compiling the CTE per call cost most of a submission's CPU)."""
    compiled: list[list[object]] = []

    def record(
        _conn: Any, _cursor: Any, _statement: str, _params: Any, context: Any, *_: Any
    ) -> None:
        compiled[-1].append(context.compiled)

    event.listen(platform.engine, "before_cursor_execute", record)
    try:
        for nodes in (2, 3):
            compiled.append([])
            manifest = manifest_yaml(compute_configuration={"name": "P100", "nodes": nodes})
            with submissions.submission(session, platform, tenant, manifest, io.BytesIO(CODE_ZIP)):
                session.commit()
    finally:
        event.remove(platform.engine, "before_cursor_execute", record)
    first, second = compiled
    assert first and len(first) == len(second)
    assert all(a is b for a, b in zip(first, second, strict=True))
