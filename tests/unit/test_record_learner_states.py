"""Recording what the backend observed of each learner (service.trainings)."""

from __future__ import annotations

from service.db.models import Learner, Training
from service.domain.lifecycle import LearnerObservation
from service.trainings import record_learner_states


def _training(*learner_ids: int) -> Training:
    training = Training(id="t1", status="RUNNING")
    training.learners = [Learner(learner_id=i, status="RUNNING") for i in learner_ids]
    return training


def _state(training: Training) -> list[tuple[int, str, int | None, str | None]]:
    return [(lr.learner_id, lr.status, lr.exit_code, lr.status_message) for lr in training.learners]


def test_each_learner_gets_its_phase_exit_code_and_message() -> None:
    training = _training(1, 2)
    record_learner_states(
        training,
        [
            LearnerObservation(2, "FAILED", exit_code=3, message="out of memory"),
            LearnerObservation(1, "COMPLETED", exit_code=0),
        ],
    )
    assert _state(training) == [(1, "COMPLETED", 0, None), (2, "FAILED", 3, "out of memory")]


def test_observations_of_unknown_learners_are_ignored() -> None:
    training = _training(1)
    record_learner_states(training, [LearnerObservation(7, "RUNNING")])
    assert _state(training) == [(1, "RUNNING", None, None)]
