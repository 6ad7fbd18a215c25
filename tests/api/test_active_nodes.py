"""A plan's max_active_nodes: the learner slots one tenant's active trainings may hold at
once. Counted by the database (SQLite and PostgreSQL), applied by the monitor's admission
(a training over it waits QUEUED, saying so, and starts once slots are freed), refused at
submission when a training could never fit it, and shown by GET /v1/usage."""

from __future__ import annotations

import io
from typing import cast

import pytest
from fastapi.testclient import TestClient
from sqlalchemy.orm import Session

from service import submissions, tenants, trainings
from service.auth import TenantRef
from service.db import repository
from service.db.models import Training
from service.dispatch import LAUNCH
from service.domain.states import TrainingState
from service.platform import Platform
from tests.conftest import CODE_ZIP, Slots, create_tenant, manifest_yaml, submit
from worker.admitting import admit_queued
from worker.backends.base import Backend

LIMIT = 3


@pytest.fixture
def platform(platform: Platform, monkeypatch: pytest.MonkeyPatch) -> Platform:
    """The default catalog plus a "team" plan: 2-node trainings, 3 learner slots at once."""
    plans = dict(platform.catalog.plans)
    plans["team"] = plans["standard"].model_copy(update={"max_nodes": 4, "max_active_nodes": LIMIT})
    monkeypatch.setattr(platform, "catalog", platform.catalog.model_copy(update={"plans": plans}))
    return platform


def _tenant(session: Session, platform: Platform, name: str, plan: str = "team") -> TenantRef:
    tenant, _ = tenants.create_tenant(session, platform.catalog, name, plan)
    session.commit()
    return TenantRef(tenant.id, tenant.name, tenant.plan)


def _submit(session: Session, platform: Platform, tenant: TenantRef, nodes: int) -> str:
    manifest = manifest_yaml(compute_configuration={"name": "P100", "nodes": nodes})
    with submissions.submission(
        session, platform, tenant, manifest, io.BytesIO(CODE_ZIP)
    ) as training:
        session.commit()
    return training.id


def _state(session: Session, training_id: str) -> tuple[str, str | None]:
    session.expire_all()
    training = session.get(Training, training_id)
    assert training is not None
    return training.status, training.status_message


def _admit(session: Session, platform: Platform, slots: int = 16) -> list[tuple[str, str]]:
    outbox: list[tuple[str, str]] = []
    admit_queued(session, platform.catalog.plans, cast(Backend, Slots(slots)), outbox)
    session.commit()
    return outbox


def _end(session: Session, training_id: str) -> None:
    training = session.get(Training, training_id)
    assert training is not None
    trainings.record_transition(training, TrainingState.COMPLETED)
    session.commit()


def test_the_database_counts_the_active_learners_of_each_tenant(
    session: Session, platform: Platform
) -> None:
    a, b = _tenant(session, platform, "a", "standard"), _tenant(session, platform, "b")
    a2, a3, a1, b2 = (
        _submit(session, platform, a, 2),
        _submit(session, platform, a, 3),
        _submit(session, platform, a, 1),
        _submit(session, platform, b, 2),
    )
    assert repository.active_load(session).nodes == {}  # QUEUED holds nothing
    for tid, states in (
        (a2, [TrainingState.PENDING]),
        (a3, [TrainingState.PENDING, TrainingState.RUNNING]),
        (a1, [TrainingState.PENDING, TrainingState.FAILED]),  # ended: holds nothing
        (b2, [TrainingState.PENDING, TrainingState.DOWNLOADING]),
    ):
        training = session.get(Training, tid)
        assert training is not None
        for state in states:
            trainings.record_transition(training, state)
    session.commit()
    load = repository.active_load(session)
    assert load.nodes == {a.id: 5, b.id: 2}
    assert load.trainings == {a.id: 2, b.id: 1}
    assert load.total_nodes == 7
    assert repository.tenant_active_nodes(session, a.id) == 5
    assert repository.tenant_active_nodes(session, b.id) == 2
    assert repository.tenant_active_nodes(session, "nobody") == 0


def test_a_tenant_at_its_learner_slots_waits_saying_so_and_others_start(
    session: Session, platform: Platform
) -> None:
    hog, other = _tenant(session, platform, "hog"), _tenant(session, platform, "other")
    first = _submit(session, platform, hog, 2)
    second = _submit(session, platform, hog, 2)  # 4 > 3: waits
    third = _submit(session, platform, hog, 1)  # would fit, but oldest first
    theirs = _submit(session, platform, other, 2)
    assert _admit(session, platform) == [(LAUNCH, first), (LAUNCH, theirs)]
    waiting = f"waiting: the plan allows {LIMIT} active learners; 2 in use"
    assert _state(session, second) == (TrainingState.QUEUED, waiting)
    assert _state(session, third) == (TrainingState.QUEUED, waiting)
    assert _state(session, theirs)[0] == TrainingState.PENDING
    # Another pass changes nothing (and writes the same message again to none).
    assert _admit(session, platform) == []
    assert _state(session, second) == (TrainingState.QUEUED, waiting)
    # The first ends: the second starts, the third (1 + 2 = 3) too.
    _end(session, first)
    assert _admit(session, platform) == [(LAUNCH, second), (LAUNCH, third)]
    assert _state(session, second) == (TrainingState.PENDING, "starting 2 learner(s)")


def test_the_waiting_message_goes_once_the_limit_no_longer_holds_the_training(
    session: Session, platform: Platform
) -> None:
    hog = _tenant(session, platform, "hog")
    first = _submit(session, platform, hog, 2)
    assert _admit(session, platform, slots=4) == [(LAUNCH, first)]
    big = _submit(session, platform, hog, 2)
    _admit(session, platform, slots=4)
    assert _state(session, big)[1] == "waiting: the plan allows 3 active learners; 2 in use"
    # Someone else fills the free slots; the hog's training ends: its next one is within
    # the plan now but waits for capacity, and no longer says it waits on the plan.
    other = _tenant(session, platform, "other")
    theirs = _submit(session, platform, other, 2)
    # (submitted after `big`: admitted only as `big` is held by the plan)
    assert _admit(session, platform, slots=4) == [(LAUNCH, theirs)]
    _end(session, first)
    filler = _submit(session, platform, _tenant(session, platform, "third"), 1)
    _end(session, theirs)
    training = session.get(Training, filler)
    assert training is not None
    trainings.record_transition(training, TrainingState.PENDING)
    trainings.record_transition(training, TrainingState.RUNNING)
    session.commit()
    assert _admit(session, platform, slots=2) == []  # 1 of 2 slots free: big does not fit
    assert _state(session, big) == (TrainingState.QUEUED, None)


def test_a_queued_training_over_a_lowered_limit_fails_saying_why(
    session: Session, platform: Platform, monkeypatch: pytest.MonkeyPatch
) -> None:
    team = _tenant(session, platform, "team")
    training_id = _submit(session, platform, team, 3)
    plans = dict(platform.catalog.plans)
    plans["team"] = plans["team"].model_copy(update={"max_active_nodes": 2})
    monkeypatch.setattr(platform, "catalog", platform.catalog.model_copy(update={"plans": plans}))
    assert _admit(session, platform) == []
    status, message = _state(session, training_id)
    assert status == TrainingState.FAILED
    assert message == (
        "capacity: 3 learners can never fit the plan's 2 active learners (max_active_nodes)"
    )


def test_a_training_that_could_never_fit_the_plan_is_refused_with_422(
    client: TestClient,
) -> None:
    team = create_tenant(client, "team", "team")
    manifest = manifest_yaml(
        framework={"name": "tensorflow", "version": "2.21", "command": "python3 train.py"},
        compute_configuration={"name": "P100", "nodes": LIMIT + 1},
    )
    r = submit(client, team, manifest)
    assert r.status_code == 422, r.text
    assert r.headers["content-type"] == "application/problem+json"
    [error] = r.json()["errors"]
    assert error["field"] == "/compute_configuration/nodes"
    assert f"at most {LIMIT} active learners" in error["message"]
    assert "max_active_nodes" in error["message"]
    ok = manifest_yaml(compute_configuration={"name": "P100", "nodes": LIMIT})
    assert submit(client, team, ok).status_code == 201


def test_usage_shows_the_active_learners_against_the_plan(
    client: TestClient, platform: Platform
) -> None:
    team = create_tenant(client, "team", "team")
    assert client.get("/v1/usage", headers=team).json()["active_nodes"] == {
        "used": 0,
        "limit": LIMIT,
    }
    r = submit(client, team, manifest_yaml(compute_configuration={"name": "P100", "nodes": 2}))
    with platform.sessions() as session:
        training = session.get(Training, r.json()["id"])
        assert training is not None
        trainings.record_transition(training, TrainingState.PENDING)
        session.commit()
    assert client.get("/v1/usage", headers=team).json()["active_nodes"] == {
        "used": 2,
        "limit": LIMIT,
    }
    standard = create_tenant(client, "std", "standard")
    plan = platform.catalog.plans["standard"]
    assert client.get("/v1/usage", headers=standard).json()["active_nodes"] == {
        "used": 0,
        "limit": plan.max_nodes * plan.max_concurrent_trainings,
    }
