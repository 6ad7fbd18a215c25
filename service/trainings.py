"""What the API does with trainings: accept, stop, delete, and record state changes.

Services never commit; the request (or the task) that calls them owns the transaction.
Every state change of a training goes through `record_transition`, so the history users
read is complete and the state machine is enforced in one place.
"""

from __future__ import annotations

from datetime import datetime
from pathlib import Path

from sqlalchemy.orm import Session

from service.auth import TenantRef, new_id
from service.db.models import Learner, StatusEvent, Training, utcnow
from service.domain.manifest import Manifest
from service.domain.states import TrainingState, check_transition
from service.errors import Conflict
from service.logs.base import LogStore
from service.secrets import SecretBox, seal_manifest
from service.storage import keys
from service.storage.base import ObjectStore


def create_training(
    session: Session,
    store: ObjectStore,
    tenant: TenantRef,
    manifest: Manifest,
    archive: Path,
    archive_format: str,
    *,
    secrets: SecretBox | None = None,
) -> Training:
    """Store the code archive and insert the training QUEUED, with one row per learner.

    The data-store credentials of the manifest are stored encrypted with `secrets`
    (required when the manifest has a data or results reference). If anything fails
    after the archive is stored, the archive is removed again: a refused submission leaves
    nothing behind.
    """
    document = manifest.model_dump(mode="json", exclude_none=True)
    if secrets is not None:
        document = seal_manifest(document, secrets)
    elif manifest.training_data_reference or manifest.training_results_reference:
        raise ValueError("a manifest with data-store credentials needs a SecretBox")
    training_id = new_id()
    key = keys.model_definition_key(training_id, archive_format)
    now = utcnow()
    training = Training(
        id=training_id,
        tenant_id=tenant.id,
        name=manifest.name,
        description=manifest.description,
        status=TrainingState.QUEUED,
        status_message="waiting for capacity",
        framework_name=manifest.framework.name,
        framework_version=manifest.framework.version,
        compute_name=manifest.compute_configuration.name,
        nodes=manifest.nodes,
        manifest=document,
        model_definition_key=key,
        created_at=now,
        updated_at=now,
    )
    training.learners = [
        Learner(learner_id=i, status=TrainingState.QUEUED, updated_at=now)
        for i in range(1, manifest.nodes + 1)
    ]
    training.events = [StatusEvent(status=TrainingState.QUEUED, at=now)]
    session.add(training)
    try:
        session.flush()
        store.put_file(key, archive)
    except BaseException:
        store.delete_prefix(keys.training_prefix(training_id))
        raise
    return training


def record_transition(
    training: Training,
    new: TrainingState,
    message: str | None = None,
    *,
    at: datetime | None = None,
) -> None:
    """Move the training to `new` (checked against the state machine) and record it."""
    check_transition(TrainingState(training.status), new)
    now = at or utcnow()
    training.status = new
    training.status_message = message
    training.updated_at = now
    if new == TrainingState.RUNNING and training.started_at is None:
        training.started_at = now
    if new.terminal:
        training.completed_at = now
    training.events.append(StatusEvent(status=new, message=message, at=now))


def request_stop(training: Training) -> bool:
    """Stop a training. Returns True if it is already HALTED (or just became so).

    A training no learner has started for (QUEUED) is halted at once. A running one gets
    a stop request that the worker acts on (learners get SIGTERM, then SIGKILL); the
    monitor records HALTED when they are gone.
    """
    state = TrainingState(training.status)
    if state == TrainingState.HALTED:
        return True
    if state.terminal:
        raise Conflict(f"training {training.id} is already {state}; there is nothing to stop")
    if training.stop_requested_at is None:
        training.stop_requested_at = utcnow()
    if state == TrainingState.QUEUED:
        record_transition(training, TrainingState.HALTED, "stopped by the user before it started")
        for learner in training.learners:
            learner.status = TrainingState.HALTED
        return True
    return False


def delete_training(
    session: Session, store: ObjectStore, logs: LogStore, training: Training
) -> bool:
    """Delete the training and its stored artifacts.

    Returns False when learners are still running: the training is asked to stop and
    marked for deletion, which the worker completes once the learners are gone.
    """
    if not TrainingState(training.status).terminal and not request_stop(training):
        training.delete_requested_at = training.delete_requested_at or utcnow()
        return False
    session.flush()  # write the HALTED transition before the rows go
    store.delete_prefix(keys.training_prefix(training.id))
    logs.delete(training.id)
    session.delete(training)
    return True
