from __future__ import annotations

import pytest

from service.domain.states import InvalidTransition, TrainingState, can_transition, check_transition

S = TrainingState


@pytest.mark.parametrize(
    ("current", "new", "allowed"),
    [
        (S.QUEUED, S.PENDING, True),
        (S.PENDING, S.DOWNLOADING, True),
        (S.DOWNLOADING, S.RUNNING, True),
        (S.RUNNING, S.STORING, True),
        (S.STORING, S.COMPLETED, True),
        (S.PENDING, S.RUNNING, True),  # a poll can miss DOWNLOADING
        (S.QUEUED, S.HALTED, True),
        (S.RUNNING, S.FAILED, True),
        (S.STORING, S.HALTED, True),
        (S.RUNNING, S.PENDING, False),  # never backwards
        (S.RUNNING, S.RUNNING, False),
        (S.QUEUED, S.QUEUED, False),
        (S.COMPLETED, S.FAILED, False),  # terminal states are final
        (S.FAILED, S.RUNNING, False),
        (S.HALTED, S.HALTED, False),
        (S.HALTED, S.COMPLETED, False),
    ],
)
def test_transitions(current: TrainingState, new: TrainingState, allowed: bool) -> None:
    assert can_transition(current, new) is allowed
    if allowed:
        check_transition(current, new)
    else:
        with pytest.raises(InvalidTransition):
            check_transition(current, new)


def test_terminal_states() -> None:
    assert {s for s in S if s.terminal} == {S.COMPLETED, S.FAILED, S.HALTED}
