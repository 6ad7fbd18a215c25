"""What `dlaas up` does to running trainings when it stops: their learners are stopped and
they are recorded HALTED, saying the platform was shut down."""

from __future__ import annotations

import logging
from concurrent.futures import ThreadPoolExecutor

from service.db import repository
from service.domain.states import TrainingState
from service.platform import Platform
from service.trainings import record_learner_states, record_transition
from worker import execution
from worker.backends import make_backend

log = logging.getLogger("dlaas.up")

SHUTDOWN_MESSAGE = (
    "interrupted: the platform was shut down (dlaas up stopped) while the training was "
    "{state}; its learners were stopped. Submit it again to re-run it"
)


def interrupt_active_trainings(platform: Platform) -> list[str]:
    """Stop the learners of every training that has some and record it HALTED (see the
    module's docstring); returns the ids of the trainings interrupted. Call it only when no
    monitor and no worker run."""
    backend = make_backend(platform.settings)
    with platform.sessions() as session:
        active = repository.active_training_ids(session)
    started = [tid for tid in active if backend.observe(tid) is not None]
    if not started:
        return []
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
            message = (
                "stopped by the user"
                if training.stop_requested_at is not None
                else SHUTDOWN_MESSAGE.format(state=training.status)
            )
            record_transition(training, TrainingState.HALTED, message)
            session.commit()
        try:
            execution.finalize(platform, backend, training_id)
        except Exception:
            log.exception("archiving the logs of %s failed", training_id)
    return started
