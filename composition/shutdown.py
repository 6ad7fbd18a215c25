"""What `dlaas up` does to running trainings when it stops: their learners are stopped and
they are recorded HALTED, saying the platform was shut down."""

from __future__ import annotations

import logging
from concurrent.futures import ThreadPoolExecutor

from service.platform import Platform

log = logging.getLogger("dlaas.up")

SHUTDOWN_MESSAGE = (
    "interrupted: the platform was shut down (dlaas up stopped) while the training was "
    "{state}; its learners were stopped. Submit it again to re-run it"
)


def interrupt_active_trainings(platform: Platform) -> list[str]:
    """Stop the learners of every training that has some and record it HALTED (see the
    module's docstring); returns the ids of the trainings interrupted. Call it only when no
    monitor and no worker run."""
    from sqlalchemy import select

    from service.db.models import Training
    from service.domain.states import TrainingState
    from service.trainings import record_transition
    from worker import execution
    from worker.backends import make_backend
    from worker.monitor import ACTIVE

    backend = make_backend(platform.settings)
    with platform.sessions() as session:
        active = session.scalars(select(Training.id).where(Training.status.in_(ACTIVE))).all()
    started = [tid for tid in active if backend.observe(tid) is not None]
    if not started:
        return []
    with ThreadPoolExecutor(max_workers=min(8, len(started))) as pool:
        list(pool.map(backend.stop, started))
    for training_id in started:
        observation = backend.observe(training_id)
        with platform.sessions() as session:
            training = session.get(Training, training_id)
            if training is None or TrainingState(training.status).terminal:
                continue
            if observation is not None:
                rows = {lr.learner_id: lr for lr in training.learners}
                for obs in observation.learners:
                    if (row := rows.get(obs.learner_id)) is not None:
                        row.status, row.exit_code, row.status_message = (
                            obs.phase,
                            obs.exit_code,
                            obs.message,
                        )
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
