"""What the API does with trainings once accepted (service.submissions accepts them):
stop, delete, and record state changes.

Services never commit; the request (or the task) that calls them owns the transaction.
Every state change of a training goes through `record_transition`, so the history users
read is complete and the state machine is enforced in one place; every learner's state
goes through `record_learner_states`.
"""

from __future__ import annotations

from collections.abc import Iterable
from datetime import datetime
from typing import TYPE_CHECKING

from sqlalchemy.orm import Session

from service.db.models import StatusEvent, Training, utcnow
from service.domain.lifecycle import LearnerObservation
from service.domain.states import TrainingState, check_requeue, check_restart, check_transition
from service.errors import (
    Conflict,
)
from service.logs.base import LogStore
from service.storage import keys
from service.storage.base import ObjectStore

if TYPE_CHECKING:
    pass


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
        halt_remaining_learners(training)
    training.events.append(
        StatusEvent(status=new, message=message, at=now, attempt=training.attempt)
    )


RETRIED = "stopped by the platform: the attempt was retried"
RELEASED = "stopped by the platform: the training's learners could not all be placed"


def attempt_started_at(training: Training) -> datetime | None:
    """When the training's current attempt started running (what max_runtime bounds)."""
    if training.attempt == 1:
        return training.started_at
    return next(
        (e.at for e in training.events if e.attempt == training.attempt and e.status == "RUNNING"),
        None,
    )


def record_restart(training: Training, message: str, *, at: datetime | None = None) -> int:
    """Start the training again as its next attempt (`service.domain.retries`): what each
    learner did in this attempt is kept in `past_attempts`, the learners start over
    PENDING, and the history records PENDING with the new attempt's number. Returns it.

    The worker's LAUNCH then stops what is left of the last attempt, saves its
    checkpoints and starts the new one (worker.execution.launch)."""
    check_restart(TrainingState(training.status))
    return _next_attempt(training, TrainingState.PENDING, message, at or utcnow(), RETRIED)


def record_requeue(training: Training, message: str, *, at: datetime | None = None) -> int:
    """Queue the training again as its next attempt, its gang released before it started
    (`service.domain.gang_release`): recorded as `record_restart` records a retry, but
    QUEUED, so it is admitted again. Returns the new attempt's number.

    The worker's STOP deletes this attempt's pods now; the LAUNCH after the next admission
    cleans up what is left of it, as for a retry."""
    check_requeue(TrainingState(training.status))
    return _next_attempt(training, TrainingState.QUEUED, message, at or utcnow(), RELEASED)


def _next_attempt(
    training: Training, state: TrainingState, message: str, now: datetime, stopped: str
) -> int:
    started = attempt_started_at(training)
    past = list(training.past_attempts or [])
    past.append(
        {
            "attempt": training.attempt,
            "started_at": started.isoformat() if started else None,
            "ended_at": now.isoformat(),
            "message": message,
            "learners": [
                {
                    "learner_id": row.learner_id,
                    "status": row.status if row.status in _ENDED else TrainingState.HALTED.value,
                    "exit_code": row.exit_code,
                    "status_message": row.status_message if row.status in _ENDED else stopped,
                }
                for row in training.learners
            ],
        }
    )
    training.past_attempts = past
    training.attempt += 1
    for row in training.learners:
        row.status, row.exit_code, row.status_message = state, None, None
    training.status = state
    training.status_message = message
    training.updated_at = now
    training.events.append(
        StatusEvent(status=state, message=message, at=now, attempt=training.attempt)
    )
    return training.attempt


# What a learner still running (or never started) when its training ended is recorded as:
# the platform stops it then (parameter servers, MPI hosts, the survivors of a failure).
STOPPED_AT_END = "stopped by the platform when the training ended"
NOT_STARTED_AT_END = "never started: the training ended first"
# A learner that runs until the workers are done (a parameter server, an MPI host) and
# the platform stopped when they completed: the completion rule, not a failure nor a halt.
STOPPED = "STOPPED"
WORKERS_COMPLETED = "the workers completed"
_ENDED = ("COMPLETED", "FAILED", "HALTED", "LOST", STOPPED)


def halt_remaining_learners(training: Training) -> None:
    """Record every learner of an ending training that has not ended, so that no learner
    of a terminal training is shown in a non-terminal phase: STOPPED (the workers
    completed) for one a COMPLETED training's completion rule stops, else HALTED. The
    worker's FINALIZE stops them and records the exit code or signal it then sees
    (`record_stopped_learners`)."""
    completed = training.status == TrainingState.COMPLETED
    for row in training.learners:
        if row.status in _ENDED:
            continue
        started = row.status not in (TrainingState.QUEUED, TrainingState.PENDING)
        if completed and started:
            row.status, row.status_message = STOPPED, WORKERS_COMPLETED
            continue
        row.status = TrainingState.HALTED
        row.status_message = STOPPED_AT_END if started else NOT_STARTED_AT_END


def record_stopped_learners(training: Training, observations: Iterable[LearnerObservation]) -> None:
    """After the platform stopped a terminal training's learners: record what each one that
    was still running when the training ended reported as it stopped (its exit code, or
    the signal as a negative code); one that reported nothing stays HALTED. One the
    completion rule stopped stays STOPPED (the workers completed), with the code it
    reported."""
    rows = {lr.learner_id: lr for lr in training.learners}
    completed = training.status == TrainingState.COMPLETED
    for obs in observations:
        row = rows.get(obs.learner_id)
        if row is None:
            continue
        if row.status not in _ENDED:
            row.status, row.status_message = (
                (STOPPED, WORKERS_COMPLETED)
                if completed
                else (TrainingState.HALTED, STOPPED_AT_END)
            )
        if row.status == STOPPED and row.status_message == WORKERS_COMPLETED:
            if obs.exit_code is not None:
                row.exit_code = obs.exit_code
            continue
        if row.status_message != STOPPED_AT_END:
            continue  # it ended on its own before the training did: recorded then
        if obs.phase in ("COMPLETED", "FAILED", "HALTED") and obs.exit_code is not None:
            row.status, row.exit_code = obs.phase, obs.exit_code
            if obs.phase != "HALTED" and obs.message:
                row.status_message = obs.message


def record_stopped_in_past_attempt(
    training: Training, observations: Iterable[LearnerObservation]
) -> None:
    """After the platform stopped the learners of the attempt before the current one:
    record in `past_attempts` the exit code or signal each one that was still running
    reported as it stopped (as `record_stopped_learners` does at the end)."""
    if not training.past_attempts:
        return
    *earlier, last = training.past_attempts
    reported = {obs.learner_id: obs for obs in observations}
    learners = []
    for entry in last["learners"]:
        obs = reported.get(entry["learner_id"])
        if (
            entry.get("status_message") == RETRIED
            and obs is not None
            and obs.phase in ("COMPLETED", "FAILED", "HALTED")
            and obs.exit_code is not None
        ):
            entry = {**entry, "status": obs.phase, "exit_code": obs.exit_code}
        learners.append(entry)
    # A new list: the JSON column is written only when it is assigned.
    training.past_attempts = [*earlier, {**last, "learners": learners}]


def record_learner_states(training: Training, observations: Iterable[LearnerObservation]) -> None:
    """Record what the backend observed of each learner: its phase, exit code and
    message. Observations of learners the training does not have are ignored; a learner
    whose state did not change is left untouched (no write)."""
    rows = {lr.learner_id: lr for lr in training.learners}
    for obs in observations:
        row = rows.get(obs.learner_id)
        if row is None:
            continue
        if (row.status, row.exit_code, row.status_message) != (
            obs.phase,
            obs.exit_code,
            obs.message,
        ):
            row.status, row.exit_code, row.status_message = obs.phase, obs.exit_code, obs.message


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
