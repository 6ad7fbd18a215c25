"""How much of the queue one admission pass reads (SQLite and PostgreSQL): a pass follows
every submission, so its cost must not grow with what tenants have queued. The queue is
read a page at a time, oldest first, only as far as admission goes; those that can never
start are found by the database."""

from __future__ import annotations

import io
from collections.abc import Iterator
from typing import Any, cast

import pytest
from sqlalchemy import update
from sqlalchemy.orm import Session

from service import submissions, tenants
from service.auth import TenantRef
from service.db import repository
from service.db.models import Training
from service.db.repository import trainings as training_rows
from service.domain.admission import Candidate, admit
from service.domain.states import TrainingState
from service.platform import Platform
from tests.conftest import CODE_ZIP, Slots, manifest_yaml
from worker.admitting import admit_queued
from worker.backends.base import Backend


def _tenant(session: Session, platform: Platform, name: str) -> TenantRef:
    tenant, _ = tenants.create_tenant(session, platform.catalog, name, "standard")
    session.commit()
    return TenantRef(tenant.id, tenant.name, tenant.plan)


def _queue(session: Session, platform: Platform, tenant: TenantRef, n: int) -> list[str]:
    ids = []
    manifest = manifest_yaml(compute_configuration={"name": "P100", "nodes": 1})
    for _ in range(n):
        with submissions.submission(
            session, platform, tenant, manifest, io.BytesIO(CODE_ZIP)
        ) as training:
            session.commit()
        ids.append(training.id)
    return ids


@pytest.fixture
def roomy(platform: Platform, monkeypatch: pytest.MonkeyPatch) -> Platform:
    """The standard plan with room for a long queue."""
    plans = dict(platform.catalog.plans)
    plans["standard"] = plans["standard"].model_copy(
        update={
            "max_queued_trainings": 1000,
            "max_concurrent_trainings": 1000,
            "max_active_nodes": 1000,
        }
    )
    monkeypatch.setattr(platform, "catalog", platform.catalog.model_copy(update={"plans": plans}))
    return platform


def _state(session: Session, training_id: str) -> tuple[str, str | None]:
    session.expire_all()
    training = session.get(Training, training_id)
    assert training is not None
    return training.status, training.status_message


def test_admission_pulls_the_queue_only_up_to_the_first_that_does_not_fit() -> None:
    pulled: list[str] = []

    def queue() -> Iterator[Candidate]:
        for i in range(1000):
            pulled.append(f"t{i}")
            yield Candidate(f"t{i}", "a", 2)

    result = admit(queue(), active_per_tenant={}, concurrency_per_tenant={"a": 9}, free_slots=3)
    assert result.started == ["t0"]
    assert pulled == ["t0", "t1"]


def test_the_queue_is_read_in_order_across_pages_with_equal_times(
    roomy: Platform, session: Session
) -> None:
    tenant = _tenant(session, roomy, "pages")
    ids = _queue(session, roomy, tenant, 11)
    # Several share one creation time: the page boundary must neither skip nor repeat them.
    same = session.get(Training, ids[3])
    assert same is not None
    session.execute(
        update(Training).where(Training.id.in_(ids[3:9])).values(created_at=same.created_at)
    )
    session.commit()
    expected = [c.training_id for c in repository.queued_candidates(session)]
    assert sorted(expected) == sorted(ids)
    for page in (1, 2, 3, 4, 64):
        read = [c.training_id for c in repository.queued_in_order(session, page=page)]
        assert read == expected, page


def test_a_pass_with_no_room_reads_one_page_of_a_long_queue(
    roomy: Platform, session: Session, monkeypatch: pytest.MonkeyPatch
) -> None:
    tenant = _tenant(session, roomy, "busy")
    running, *ids = _queue(session, roomy, tenant, 1 + 3 * training_rows.QUEUE_PAGE)
    # The platform's one slot is taken.
    session.execute(
        update(Training).where(Training.id == running).values(status=TrainingState.RUNNING)
    )
    session.commit()
    built: list[Any] = []

    class Counted(Candidate):
        def __init__(self, *args: Any) -> None:
            super().__init__(*args)
            built.append(self)

    monkeypatch.setattr(training_rows, "Candidate", Counted)
    outbox: list[tuple[str, str]] = []
    admit_queued(session, roomy.catalog.plans, cast(Backend, Slots(1)), outbox)
    session.commit()
    assert outbox == []
    assert 0 < len(built) <= training_rows.QUEUE_PAGE
    assert [c.training_id for c in built] == ids[: len(built)]

    # With room for some, it reads as far as they go, in order.
    built.clear()
    admit_queued(session, roomy.catalog.plans, cast(Backend, Slots(3)), outbox)
    session.commit()
    assert [t for _, t in outbox] == ids[:2]
    assert len(built) <= training_rows.QUEUE_PAGE


def test_those_that_can_never_start_are_failed_wherever_they_are_in_the_queue(
    roomy: Platform, session: Session, monkeypatch: pytest.MonkeyPatch
) -> None:
    tenant = _tenant(session, roomy, "mixed")
    ids = _queue(session, roomy, tenant, 2 * training_rows.QUEUE_PAGE + 5)
    too_big, over_plan = ids[-1], ids[-2]
    session.execute(update(Training).where(Training.id == too_big).values(nodes=9))
    session.execute(update(Training).where(Training.id == over_plan).values(nodes=4))
    session.commit()
    # The catalog changed since they were accepted: 3 active learners at most now.
    plans = dict(roomy.catalog.plans)
    plans["standard"] = plans["standard"].model_copy(update={"max_active_nodes": 3})
    monkeypatch.setattr(roomy, "catalog", roomy.catalog.model_copy(update={"plans": plans}))
    outbox: list[tuple[str, str]] = []
    admit_queued(session, roomy.catalog.plans, cast(Backend, Slots(8)), outbox)
    session.commit()
    assert _state(session, too_big) == (
        TrainingState.FAILED,
        "capacity: 9 learners can never fit this platform's 8 learner slots",
    )
    assert _state(session, over_plan) == (
        TrainingState.FAILED,
        "capacity: 4 learners can never fit the plan's 3 active learners (max_active_nodes)",
    )
    # The others are admitted as far as the plan allows, oldest first; the next waits.
    assert [t for _, t in outbox] == ids[:3]
    assert _state(session, ids[3]) == (
        TrainingState.QUEUED,
        "waiting: the plan allows 3 active learners; 3 in use",
    )


def test_a_training_held_back_by_its_tenant_does_not_hold_back_another_tenants(
    roomy: Platform, session: Session, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The queue is read past a tenant at its concurrency (pages, however many)."""
    plans = dict(roomy.catalog.plans)
    plans["one"] = plans["standard"].model_copy(update={"max_concurrent_trainings": 1})
    monkeypatch.setattr(roomy, "catalog", roomy.catalog.model_copy(update={"plans": plans}))
    held, _ = tenants.create_tenant(session, roomy.catalog, "held", "one")
    session.commit()
    held_ref = TenantRef(held.id, held.name, held.plan)
    first = _queue(session, roomy, held_ref, 1)
    outbox: list[tuple[str, str]] = []
    admit_queued(session, roomy.catalog.plans, cast(Backend, Slots(8)), outbox)
    session.commit()
    assert [t for _, t in outbox] == first
    _queue(session, roomy, held_ref, training_rows.QUEUE_PAGE + 3)
    other = _queue(session, roomy, _tenant(session, roomy, "other"), 1)
    outbox.clear()
    admit_queued(session, roomy.catalog.plans, cast(Backend, Slots(8)), outbox)
    assert [t for _, t in outbox] == other
