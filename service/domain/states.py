"""The training state machine.

QUEUED -> PENDING -> DOWNLOADING -> RUNNING -> STORING -> COMPLETED, and any non-terminal
state may go to FAILED or HALTED (a user's stop). Terminal states are final. States may be
skipped forward (a monitor that polls can see a learner go from PENDING straight to
RUNNING) but never backwards, except by a new *attempt*: a retry (`check_restart`) takes
an active training back to PENDING with the same id, and a gang released before it
started (`check_requeue`, service.domain.gang_release) takes it back to QUEUED.
"""

from __future__ import annotations

from enum import StrEnum


class TrainingState(StrEnum):
    QUEUED = "QUEUED"
    PENDING = "PENDING"
    DOWNLOADING = "DOWNLOADING"
    RUNNING = "RUNNING"
    STORING = "STORING"
    COMPLETED = "COMPLETED"
    FAILED = "FAILED"
    HALTED = "HALTED"

    @property
    def terminal(self) -> bool:
        return self in TERMINAL_STATES


TERMINAL_STATES = frozenset({TrainingState.COMPLETED, TrainingState.FAILED, TrainingState.HALTED})

# The states in which a training holds (or is about to hold) learners: what the monitor
# observes and what counts against capacity.
ACTIVE_STATES = (
    TrainingState.PENDING,
    TrainingState.DOWNLOADING,
    TrainingState.RUNNING,
    TrainingState.STORING,
)

PROGRESSION = (
    TrainingState.QUEUED,
    TrainingState.PENDING,
    TrainingState.DOWNLOADING,
    TrainingState.RUNNING,
    TrainingState.STORING,
    TrainingState.COMPLETED,
)


class InvalidTransition(ValueError):
    def __init__(self, current: TrainingState, new: TrainingState) -> None:
        super().__init__(f"a training cannot go from {current} to {new}")
        self.current = current
        self.new = new


def can_transition(current: TrainingState, new: TrainingState) -> bool:
    """Whether `current -> new` is allowed (a repeat of the same state is not a transition)."""
    if current.terminal or current == new:
        return False
    if new in (TrainingState.FAILED, TrainingState.HALTED):
        return True
    return PROGRESSION.index(new) > PROGRESSION.index(current)


def check_transition(current: TrainingState, new: TrainingState) -> None:
    if not can_transition(current, new):
        raise InvalidTransition(current, new)


def check_restart(current: TrainingState) -> None:
    """A new attempt starts the progression again, from PENDING: only a training that
    holds learners (an active one) can be started again; a terminal one is final."""
    if current not in ACTIVE_STATES:
        raise InvalidTransition(current, TrainingState.PENDING)


# The states of a training whose learners have not all started: a gang released then
# (service.domain.gang_release) goes back to the queue.
REQUEUE_FROM = (TrainingState.PENDING, TrainingState.DOWNLOADING)


def check_requeue(current: TrainingState) -> None:
    """A training goes back to QUEUED, as a new attempt, only from a state in which not
    every learner runs yet."""
    if current not in REQUEUE_FROM:
        raise InvalidTransition(current, TrainingState.QUEUED)
