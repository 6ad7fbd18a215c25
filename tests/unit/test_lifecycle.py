"""How a training's state follows its learners, table-driven."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from service.domain.lifecycle import Action, LearnerObservation, decide
from service.domain.states import TrainingState

S = TrainingState
NOW = datetime(2026, 1, 1, 12, 0, tzinfo=UTC)


def obs(*phases: str, codes: dict[int, int] | None = None) -> list[LearnerObservation]:
    codes = codes or {}
    return [LearnerObservation(i, p, codes.get(i)) for i, p in enumerate(phases, 1)]


@pytest.mark.parametrize(
    ("current", "learners", "primaries", "state", "actions", "words"),
    [
        # progress follows the least advanced learner
        (S.PENDING, obs("PENDING", "DOWNLOADING"), [1, 2], None, (), None),
        (S.PENDING, obs("DOWNLOADING", "RUNNING"), [1, 2], S.DOWNLOADING, (), None),
        (S.PENDING, obs("RUNNING", "RUNNING"), [1, 2], S.RUNNING, (), None),
        (S.RUNNING, obs("RUNNING", "DOWNLOADING"), [1, 2], None, (), None),  # never backwards
        (S.RUNNING, obs("STORING", "STORING"), [1, 2], S.STORING, (), None),
        # a finished worker does not hold the training back; the running one does
        (S.RUNNING, obs("RUNNING", "COMPLETED", "RUNNING"), [2, 3], None, (), None),
        # completion: every primary exited 0, secondaries (ps) are stopped by FINALIZE
        (
            S.RUNNING,
            obs("RUNNING", "COMPLETED", "COMPLETED"),
            [2, 3],
            S.COMPLETED,
            (Action.FINALIZE,),
            None,
        ),
        (S.STORING, obs("COMPLETED"), [1], S.COMPLETED, (Action.FINALIZE,), None),
        (S.RUNNING, obs("COMPLETED", "RUNNING"), [1], S.COMPLETED, (Action.FINALIZE,), None),
        # gang failure: one learner failing fails the training
        (
            S.RUNNING,
            obs("RUNNING", "FAILED", codes={2: 3}),
            [1, 2],
            S.FAILED,
            (Action.FINALIZE,),
            "learner 2 exited with code 3",
        ),
        (
            S.RUNNING,
            obs("RUNNING", "LOST"),
            [1, 2],
            S.FAILED,
            (Action.FINALIZE,),
            "learner 2 ended (lost)",
        ),
        # a learner that exits 0 is never a failure: a parameter server (secondary) that
        # exits 0 before the workers is recorded and the training goes on ...
        (S.RUNNING, obs("COMPLETED", "RUNNING", codes={1: 0}), [2], None, (), None),
        (S.RUNNING, obs("COMPLETED", "COMPLETED", "RUNNING"), [2, 3], None, (), None),
        # ... and completes when every primary has exited 0, whichever ended first
        (
            S.RUNNING,
            obs("COMPLETED", "COMPLETED", codes={1: 0, 2: 0}),
            [2],
            S.COMPLETED,
            (Action.FINALIZE,),
            None,
        ),
        (
            S.PENDING,
            obs("COMPLETED", "COMPLETED", "COMPLETED"),
            [2, 3],
            S.COMPLETED,
            (Action.FINALIZE,),
            None,
        ),
        # a secondary that exits non-zero, is lost or stopped still fails the training
        (
            S.RUNNING,
            obs("FAILED", "RUNNING", codes={1: 1}),
            [2],
            S.FAILED,
            (Action.FINALIZE,),
            "learner 1 exited with code 1",
        ),
        (S.RUNNING, obs("LOST", "RUNNING"), [2], S.FAILED, (Action.FINALIZE,), "lost"),
        (S.RUNNING, obs("HALTED", "COMPLETED"), [2], S.FAILED, (Action.FINALIZE,), "halted"),
        (S.RUNNING, obs("HALTED", "RUNNING"), [1, 2], S.FAILED, (Action.FINALIZE,), "halted"),
    ],
)
def test_decisions(
    current: TrainingState,
    learners: list[LearnerObservation],
    primaries: list[int],
    state: TrainingState | None,
    actions: tuple[Action, ...],
    words: str | None,
) -> None:
    d = decide(
        current,
        learners,
        primaries,
        stop_requested=False,
        started_at=None,
        max_runtime=None,
        now=NOW,
    )
    assert d.state == state
    assert d.actions == actions
    if words:
        assert d.message is not None and words in d.message


def test_failure_keeps_the_learners_own_message() -> None:
    learners = [LearnerObservation(1, "FAILED", 137, "learner 1 was killed by signal SIGKILL")]
    d = decide(
        S.RUNNING, learners, [1], stop_requested=False, started_at=None, max_runtime=None, now=NOW
    )
    assert d.message == "learner 1 was killed by signal SIGKILL"


def test_stop_request_stops_then_halts() -> None:
    running = obs("RUNNING", "RUNNING")
    d = decide(
        S.RUNNING, running, [1, 2], stop_requested=True, started_at=None, max_runtime=None, now=NOW
    )
    assert d == type(d)(actions=(Action.STOP,))
    gone = obs("HALTED", "HALTED")
    d = decide(
        S.RUNNING, gone, [1, 2], stop_requested=True, started_at=None, max_runtime=None, now=NOW
    )
    assert d.state == S.HALTED and d.actions == (Action.FINALIZE,)


@pytest.mark.parametrize(("elapsed", "times_out"), [(59, False), (61, True)])
def test_max_runtime(elapsed: int, times_out: bool) -> None:
    d = decide(
        S.RUNNING,
        obs("RUNNING"),
        [1],
        stop_requested=False,
        started_at=NOW - timedelta(seconds=elapsed),
        max_runtime=60,
        now=NOW,
    )
    assert (d.state == S.FAILED) is times_out
    if times_out:
        assert d.message is not None and "timeout" in d.message and "60 s" in d.message


def test_terminal_and_queued_trainings_are_left_alone() -> None:
    for state in (S.COMPLETED, S.FAILED, S.HALTED, S.QUEUED):
        d = decide(
            state,
            obs("FAILED"),
            [1],
            stop_requested=True,
            started_at=None,
            max_runtime=None,
            now=NOW,
        )
        assert d.state is None and d.actions == ()


def test_states_passed_between_two_polls_are_recorded_with_their_times() -> None:
    from service.domain.lifecycle import passed_through

    quick = [
        LearnerObservation(
            1,
            "COMPLETED",
            0,
            None,
            (("DOWNLOADING", 10.0), ("RUNNING", 11.0), ("STORING", 12.5), ("COMPLETED", 13.0)),
        ),
        LearnerObservation(
            2,
            "COMPLETED",
            0,
            None,
            (("DOWNLOADING", 10.2), ("RUNNING", 10.9), ("STORING", 12.0), ("COMPLETED", 13.1)),
        ),
    ]
    assert passed_through(S.DOWNLOADING, S.COMPLETED, quick) == [
        (S.RUNNING, 10.9),
        (S.STORING, 12.0),
    ]
    assert passed_through(S.PENDING, S.RUNNING, quick) == [(S.DOWNLOADING, 10.0)]
    assert passed_through(S.RUNNING, S.STORING, quick) == []
    # Nothing is invented for phases no learner reported, nor for failures.
    assert passed_through(S.PENDING, S.COMPLETED, obs("COMPLETED")) == []
    assert passed_through(S.PENDING, S.FAILED, quick) == []
