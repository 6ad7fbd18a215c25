"""What `dlaas up` does to running trainings when it stops: their learners are stopped and
they are recorded HALTED, saying the platform was shut down; or, where their retry policy
covers lost learners and attempts are left, recorded as interrupted with their
checkpoints saved, to resume as a new attempt when the platform starts again.

The same with DLAAS_BACKEND=kubernetes: "stopped" is the training's pods deleted (with the
grace period), and its Secret and Service go with the cleanup that follows. `dlaas up` is a
control plane in a terminal: once it is gone nothing would watch those pods, enforce their
training's limits or record how they end, while they keep holding the cluster's GPUs. A
control plane that outlives its terminal is the Helm chart's; an unclean end (kill -9)
leaves the pods running, and the next `dlaas up` finds them again by their labels."""

from __future__ import annotations

import logging
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

from composition.backend import close_backend
from service.db import repository
from service.db.models import Training
from service.domain.retries import Retries
from service.domain.states import TrainingState
from service.platform import Platform
from service.trainings import record_learner_states, record_restart, record_transition
from worker import execution
from worker.backends import make_backend
from worker.backends.base import Backend

log = logging.getLogger("dlaas.up")

SHUTDOWN_MESSAGE = (
    "interrupted: the platform was shut down (dlaas up stopped) while the training was "
    "{state}; its learners were stopped. Submit it again to re-run it"
)


RESUME_MESSAGE = (
    "attempt {attempt} of {attempts} interrupted: the platform was shut down (dlaas up "
    "stopped) while the training was {state}; it resumes as attempt {next} from its "
    "checkpoints when the platform starts again"
)


def _resumable(platform: Platform, backend: Backend, training: Training) -> bool:
    """Save the interrupted attempt's checkpoints; False if they could not be."""
    try:
        execution.save_checkpoints(platform, backend, training, training.attempt)
    except Exception:
        log.exception("saving the checkpoints of %s failed; it is halted", training.id)
        return False
    return True


@dataclass
class Interrupted:
    """The trainings a shutdown interrupted: halted, or waiting to resume on the next start."""

    halted: list[str] = field(default_factory=list)
    resuming: list[str] = field(default_factory=list)

    def __iadd__(self, other: Interrupted) -> Interrupted:
        self.halted += other.halted
        self.resuming += other.resuming
        return self


def interrupt_active_trainings(platform: Platform) -> Interrupted:
    """Stop the learners of every training that has some and record it HALTED, or as
    interrupted to resume (see the module's docstring); returns which were which. Call it
    only when no monitor and no worker run."""
    backend = make_backend(platform.settings)
    try:
        return _interrupt(platform, backend)
    finally:
        close_backend(backend)


def _interrupt(platform: Platform, backend: Backend) -> Interrupted:
    interrupted = Interrupted()
    with platform.sessions() as session:
        active = repository.active_training_ids(session)
    started = [tid for tid in active if backend.observe(tid) is not None]
    for training_id in set(active) - set(started):
        # A start cut short (its learners not all spawned) holds processes all the same:
        # released, the training stays PENDING and the next start launches it whole.
        backend.cleanup(training_id)
    if not started:
        return interrupted
    with ThreadPoolExecutor(max_workers=min(8, len(started))) as pool:
        list(pool.map(backend.stop, started))
    for training_id in started:
        observation = backend.observe(training_id)
        with platform.sessions() as session:
            training = repository.training_by_id(session, training_id)
            if training is None or TrainingState(training.status).terminal:
                continue
            if observation is not None:
                record_learner_states(training, observation.learners)
            retries = Retries.of(training.manifest.get("retry_policy"))
            if (
                training.stop_requested_at is None
                and retries is not None
                and retries.covers_shutdown(training.attempt)
                and _resumable(platform, backend, training)
            ):
                message = RESUME_MESSAGE.format(
                    attempt=training.attempt,
                    attempts=retries.attempts,
                    state=training.status,
                    next=training.attempt + 1,
                )
                record_restart(training, message)
                session.commit()
                backend.cleanup(training_id)
                interrupted.resuming.append(training_id)
                continue
            message = (
                "stopped by the user"
                if training.stop_requested_at is not None
                else SHUTDOWN_MESSAGE.format(state=training.status)
            )
            record_transition(training, TrainingState.HALTED, message)
            session.commit()
            interrupted.halted.append(training_id)
        try:
            execution.finalize(platform, backend, training_id)
        except Exception:
            log.exception("archiving the logs of %s failed", training_id)
    return interrupted
