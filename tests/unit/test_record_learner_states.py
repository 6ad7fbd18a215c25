"""Recording what the backend observed of each learner (service.trainings)."""

from __future__ import annotations

from service.db.models import Learner, Training
from service.domain.lifecycle import LearnerObservation
from service.domain.states import TrainingState
from service.trainings import (
    NOT_STARTED_AT_END,
    STOPPED_AT_END,
    WORKERS_COMPLETED,
    record_learner_states,
    record_stopped_learners,
    record_transition,
)


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


def test_a_terminal_transition_leaves_no_learner_in_a_non_terminal_phase() -> None:
    training = _training(1, 2, 3)
    training.learners[1].status = "COMPLETED"
    training.learners[2].status = "PENDING"
    record_transition(training, TrainingState.COMPLETED)
    assert _state(training) == [
        (1, "STOPPED", None, WORKERS_COMPLETED),
        (2, "COMPLETED", None, None),
        (3, "HALTED", None, NOT_STARTED_AT_END),
    ]


def test_a_learner_the_completion_rule_stops_is_stopped_not_halted() -> None:
    # A parameter server (learner 1) runs until the workers complete; the platform stops
    # it then. It is STOPPED (the workers completed), with the signal it reported.
    training = _training(1, 2, 3)
    for row in training.learners[1:]:
        row.status, row.exit_code = "COMPLETED", 0
    record_transition(training, TrainingState.COMPLETED)
    record_stopped_learners(
        training,
        [
            LearnerObservation(1, "HALTED", exit_code=-15, message="learner 1 was stopped"),
            LearnerObservation(2, "COMPLETED", exit_code=0),
            LearnerObservation(3, "COMPLETED", exit_code=0),
        ],
    )
    assert _state(training) == [
        (1, "STOPPED", -15, WORKERS_COMPLETED),
        (2, "COMPLETED", 0, None),
        (3, "COMPLETED", 0, None),
    ]
    assert WORKERS_COMPLETED == "the workers completed"


def test_a_learner_stopped_as_a_training_fails_or_halts_is_halted() -> None:
    for state in (TrainingState.FAILED, TrainingState.HALTED):
        training = _training(1, 2)
        training.learners[1].status = "FAILED"
        record_transition(training, state, "learner 2 exited with code 3")
        record_stopped_learners(training, [LearnerObservation(1, "HALTED", exit_code=-15)])
        assert _state(training)[0] == (1, "HALTED", -15, STOPPED_AT_END)


def test_the_stopped_learners_get_the_exit_code_they_reported() -> None:
    training = _training(1, 2, 3)
    training.learners[1].status = "COMPLETED"
    training.learners[1].exit_code = 0
    record_transition(training, TrainingState.FAILED, "learner 2 exited with code 3")
    record_stopped_learners(
        training,
        [
            LearnerObservation(1, "HALTED", exit_code=-15, message="learner 1 was stopped"),
            # it ended on its own before the training did: its record stays as it was
            LearnerObservation(2, "HALTED", exit_code=-15),
            # killed without a word: HALTED, no exit code
            LearnerObservation(3, "LOST", message="learner 3 stopped reporting (lost)"),
        ],
    )
    assert _state(training) == [
        (1, "HALTED", -15, STOPPED_AT_END),
        (2, "COMPLETED", 0, None),
        (3, "HALTED", None, STOPPED_AT_END),
    ]
