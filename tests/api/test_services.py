"""The repository's queries and the services over them (tenants, trainings), on SQLite
and PostgreSQL, without the HTTP layer."""

from __future__ import annotations

import io
from datetime import UTC, datetime, timedelta

import pytest
from sqlalchemy import func, select
from sqlalchemy.orm import Session

from service import submissions, tenants, trainings
from service.auth import TenantRef, hash_api_key
from service.db import repository
from service.db.models import ApiKey, Training, utcnow
from service.domain.lifecycle import LearnerObservation
from service.domain.states import ACTIVE_STATES, TrainingState
from service.errors import Conflict, NotFound, ServiceUnavailable, ValidationFailed
from service.platform import Platform
from service.storage import keys
from service.storage.base import StoreUnavailable
from tests.conftest import CODE_ZIP, manifest_yaml


def _tenant(session: Session, platform: Platform, name: str = "acme") -> TenantRef:
    tenant, _ = tenants.create_tenant(session, platform.catalog, name, "standard")
    session.commit()
    return TenantRef(tenant.id, tenant.name, tenant.plan)


def _submit(session: Session, platform: Platform, tenant: TenantRef, nodes: int = 1) -> Training:
    manifest = manifest_yaml(compute_configuration={"name": "P100", "nodes": nodes})
    with submissions.submission(
        session, platform, tenant, manifest, io.BytesIO(CODE_ZIP)
    ) as training:
        session.commit()
    return training


def _move(training: Training, *states: TrainingState) -> None:
    for state in states:
        trainings.record_transition(training, state)


# -- tenants -----------------------------------------------------------------------------


def test_a_new_tenant_gets_a_key_that_authenticates(session: Session, platform: Platform) -> None:
    tenant, key = tenants.create_tenant(session, platform.catalog, "acme", "lite")
    session.commit()
    assert (tenant.name, tenant.plan) == ("acme", "lite")
    found = repository.tenant_for_key_hash(session, hash_api_key(key))
    assert found is not None and found.id == tenant.id
    stored = session.scalars(select(ApiKey).where(ApiKey.tenant_id == tenant.id)).one()
    assert stored.prefix == key[:12] and stored.key_hash != key


def test_a_tenant_needs_an_offered_plan_and_a_free_name(
    session: Session, platform: Platform
) -> None:
    with pytest.raises(ValidationFailed) as refused:
        tenants.create_tenant(session, platform.catalog, "acme", "platinum")
    assert [e.field for e in refused.value.errors] == ["plan"]
    assert "unknown plan 'platinum'; offered: " in refused.value.errors[0].message
    _tenant(session, platform, "acme")
    with pytest.raises(Conflict, match="a tenant named 'acme' already exists"):
        tenants.create_tenant(session, platform.catalog, "acme", "standard")


def test_the_tenant_services_leave_the_commit_to_the_caller(
    session: Session, platform: Platform
) -> None:
    tenant, _ = tenants.create_tenant(session, platform.catalog, "acme", "standard")
    tenants.issue_key(session, tenant)
    session.rollback()
    assert repository.tenant_by_name(session, "acme") is None
    assert session.scalar(select(func.count()).select_from(ApiKey)) == 0


def test_an_existing_tenant_can_be_issued_another_key(session: Session, platform: Platform) -> None:
    """What `dlaas up` does for its `local` tenant when the client has lost its key."""
    tenant, first = tenants.create_tenant(session, platform.catalog, "local", "standard")
    session.commit()
    found = repository.tenant_by_name(session, "local")
    assert found is not None
    second = tenants.issue_key(session, found)
    session.commit()
    assert second != first
    for key in (first, second):
        owner = repository.tenant_for_key_hash(session, hash_api_key(key))
        assert owner is not None and owner.id == tenant.id


# -- the monitor's and the worker's queries ----------------------------------------------


def test_last_used_is_written_at_most_once_a_minute(session: Session, platform: Platform) -> None:
    tenant, _ = tenants.create_tenant(session, platform.catalog, "acme", "lite")
    session.commit()
    row = session.scalars(select(ApiKey).where(ApiKey.tenant_id == tenant.id)).one()
    assert row.last_used_at is None
    t0 = datetime(2026, 1, 1, 12, 0, tzinfo=UTC)
    assert tenants.record_use(session, row, t0)
    session.commit()
    session.refresh(row)
    assert row.last_used_at == t0
    # Within the minute: nothing written.
    assert not tenants.record_use(session, row, t0 + timedelta(seconds=59))
    # Another process that read the row before t0 writes nothing either.
    later = t0 + timedelta(seconds=30)
    repository.touch_key(session, row.id, later, later - tenants.LAST_USED_RESOLUTION)
    session.commit()
    session.refresh(row)
    assert row.last_used_at == t0
    assert tenants.record_use(session, row, t0 + timedelta(seconds=61))
    session.commit()
    session.refresh(row)
    assert row.last_used_at == t0 + timedelta(seconds=61)


def test_revoking_a_key_bumps_the_revocation_counter_once(
    session: Session, platform: Platform
) -> None:
    tenant, first = tenants.create_tenant(session, platform.catalog, "acme", "lite")
    second, _ = tenants.add_key(session, tenant.id)
    session.commit()
    assert platform.revocation_epoch() == 0
    first_id = repository.tenant_keys(session, tenant.id)[0].id
    tenants.revoke_key(session, tenant.id, first_id)
    assert platform.revocation_epoch() == 0  # not before the commit
    session.commit()
    assert platform.revocation_epoch() == 1
    assert repository.tenant_for_key_hash(session, hash_api_key(first)) is None
    tenants.revoke_key(session, tenant.id, first_id)  # again: nothing changes
    session.commit()
    assert platform.revocation_epoch() == 1
    tenants.revoke_key(session, tenant.id, second.id)
    session.commit()
    assert platform.revocation_epoch() == 2
    rows = repository.tenant_keys(session, tenant.id)
    assert len(rows) == 2 and all(r.revoked_at is not None for r in rows)  # history kept
    with pytest.raises(NotFound):
        tenants.revoke_key(session, "someone-else", first_id)
    with pytest.raises(NotFound):
        tenants.add_key(session, "nosuchtenant")


def test_the_monitor_finds_queued_active_and_deletable_trainings(
    session: Session, platform: Platform
) -> None:
    acme = _tenant(session, platform, "acme")
    other = _tenant(session, platform, "other")
    queued, pending, running, ended, deleted = (
        _submit(session, platform, acme if i % 2 == 0 else other) for i in range(5)
    )
    _move(pending, TrainingState.PENDING)
    _move(running, TrainingState.PENDING, TrainingState.RUNNING)
    _move(ended, TrainingState.PENDING, TrainingState.FAILED)
    _move(deleted, TrainingState.PENDING, TrainingState.RUNNING)
    deleted.delete_requested_at = utcnow()
    session.commit()

    assert [c.training_id for c in repository.queued_candidates(session)] == [queued.id]
    assert repository.queued_candidates(session)[0].nodes == queued.nodes
    everyone = {queued.id, pending.id, running.id, ended.id, deleted.id}
    assert [t.id for t in repository.queued_trainings_among(session, everyone)] == [queued.id]
    assert repository.queued_trainings_among(session, set()) == []
    ended.results_bytes = 1000
    session.commit()
    assert [t.id for t in repository.active_trainings(session)] == [
        pending.id,
        running.id,
        deleted.id,
    ]
    assert set(repository.active_training_ids(session)) == {pending.id, running.id, deleted.id}
    # Deleted once its learners are gone, not before.
    assert repository.trainings_to_delete(session) == []
    _move(deleted, TrainingState.HALTED)
    session.commit()
    assert [t.id for t in repository.trainings_to_delete(session)] == [deleted.id]
    assert repository.plans_of_tenants(session, {acme.id, other.id, "nobody"}) == {
        acme.id: "standard",
        other.id: "standard",
    }
    assert repository.training_by_id(session, ended.id) is ended
    assert repository.training_by_id(session, "nothing") is None


def test_the_active_states_are_the_ones_that_hold_learners() -> None:
    assert ACTIVE_STATES == (
        TrainingState.PENDING,
        TrainingState.DOWNLOADING,
        TrainingState.RUNNING,
        TrainingState.STORING,
    )


# -- trainings ---------------------------------------------------------------------------


def test_learner_states_are_written_only_when_they_change(
    session: Session, platform: Platform
) -> None:
    training = _submit(session, platform, _tenant(session, platform), nodes=2)
    first, second = training.learners
    trainings.record_learner_states(
        training,
        [LearnerObservation(1, "QUEUED"), LearnerObservation(2, "RUNNING", message="epoch 1")],
    )
    assert not session.is_modified(first)
    assert session.is_modified(second)
    session.commit()
    session.expire_all()
    assert [(lr.status, lr.status_message) for lr in training.learners] == [
        ("QUEUED", None),
        ("RUNNING", "epoch 1"),
    ]


def test_a_submission_is_committed_by_the_caller_and_wakes_the_monitor(
    session: Session, platform: Platform
) -> None:
    tenant = _tenant(session, platform)
    platform.monitor_wakeup.clear()
    with submissions.submission(
        session, platform, tenant, manifest_yaml(), io.BytesIO(CODE_ZIP)
    ) as training:
        assert not platform.monitor_wakeup.is_set()
        assert training.status == TrainingState.QUEUED
        session.commit()
    assert platform.monitor_wakeup.is_set()
    assert platform.store.stat(training.model_definition_key) is not None


def test_a_submission_whose_commit_fails_leaves_nothing_behind(
    session: Session, platform: Platform
) -> None:
    tenant = _tenant(session, platform)
    platform.monitor_wakeup.clear()
    with (
        pytest.raises(RuntimeError, match="the database went away"),
        submissions.submission(
            session, platform, tenant, manifest_yaml(), io.BytesIO(CODE_ZIP)
        ) as training,
    ):
        raise RuntimeError("the database went away")
    session.rollback()
    assert list(platform.store.list(keys.training_prefix(training.id))) == []
    assert repository.training_by_id(session, training.id) is None
    assert not platform.monitor_wakeup.is_set()


def test_a_submission_the_store_cannot_take_is_unavailable(
    session: Session, platform: Platform, monkeypatch: pytest.MonkeyPatch
) -> None:
    tenant = _tenant(session, platform)

    def refuse(*_: object) -> None:
        raise StoreUnavailable("the store is down")

    monkeypatch.setattr(platform.store, "put_stream", refuse)
    with (
        pytest.raises(ServiceUnavailable, match="the code archive cannot be stored: the store"),
        submissions.submission(session, platform, tenant, manifest_yaml(), io.BytesIO(CODE_ZIP)),
    ):
        pytest.fail("no training to commit")
    session.rollback()
    assert list(platform.store.list("trainings/")) == []


def test_an_unsafe_archive_is_refused_naming_the_model_definition(
    session: Session, platform: Platform
) -> None:
    tenant = _tenant(session, platform)
    with (
        pytest.raises(ValidationFailed) as refused,
        submissions.submission(
            session, platform, tenant, manifest_yaml(), io.BytesIO(b"not an archive")
        ),
    ):
        pytest.fail("no training to commit")
    assert [e.field for e in refused.value.errors] == ["model_definition"]
    assert session.scalar(select(func.count()).select_from(Training)) == 0
