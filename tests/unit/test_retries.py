"""When a failed training is started again, table-driven (service.domain.retries and the
lifecycle decision that applies it)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from service.domain.lifecycle import Action, LearnerObservation, decide
from service.domain.retries import Retries, lost
from service.domain.states import InvalidTransition, TrainingState, check_restart
from service.storage import keys

S = TrainingState
NOW = datetime(2026, 1, 1, 12, 0, tzinfo=UTC)
ON_LOST = Retries(max_retries=2, on_lost=True)
ON_3 = Retries(max_retries=1, on_exit_codes=frozenset({3}))


def learners(*specs: tuple[str, int | None]) -> list[LearnerObservation]:
    return [LearnerObservation(i, phase, code) for i, (phase, code) in enumerate(specs, 1)]


def run(
    observed: list[LearnerObservation], retries: Retries | None, attempt: int = 1, **kw: object
) -> tuple[TrainingState | None, tuple[Action, ...], str | None]:
    d = decide(
        S.RUNNING,
        observed,
        [o.learner_id for o in observed],
        stop_requested=bool(kw.get("stop", False)),
        started_at=kw.get("started_at"),  # type: ignore[arg-type]
        max_runtime=kw.get("max_runtime"),  # type: ignore[arg-type]
        now=NOW,
        attempt=attempt,
        retries=retries,
    )
    return d.state, d.actions, d.message


RUNNING = ("RUNNING", None)


@pytest.mark.parametrize(
    ("observed", "retries", "attempt", "state", "action", "words"),
    [
        # lost, covered, attempts left: another attempt, saying which and why
        (
            learners(RUNNING, ("LOST", None)),
            ON_LOST,
            1,
            None,
            Action.RETRY,
            "attempt 1 of 3 failed: learner 2 ended (lost) before the training completed; "
            "starting attempt 2",
        ),
        (learners(RUNNING, ("LOST", None)), ON_LOST, 2, None, Action.RETRY, "attempt 2 of 3"),
        # killed by SIGKILL (the OOM killer, a node shut down) counts as lost
        (learners(("FAILED", -9), RUNNING), ON_LOST, 1, None, Action.RETRY, "attempt 1 of 3"),
        # attempts used up: the failure ends it and names the attempt
        (
            learners(RUNNING, ("LOST", None)),
            ON_LOST,
            3,
            S.FAILED,
            Action.FINALIZE,
            "attempt 3 of 3: learner 2 ended (lost) before the training completed "
            "(no retries left)",
        ),
        # a listed exit code is retried; another is not
        (learners(("FAILED", 3), RUNNING), ON_3, 1, None, Action.RETRY, "exited with code 3"),
        (
            learners(("FAILED", 4), RUNNING),
            ON_3,
            1,
            S.FAILED,
            Action.FINALIZE,
            "attempt 1 of 2: learner 1 exited with code 4 (its retry_policy does not retry it)",
        ),
        # lost is not retried by a policy that lists exit codes only
        (learners(RUNNING, ("LOST", None)), ON_3, 1, S.FAILED, Action.FINALIZE, "does not retry"),
        # an exit code is not "lost", whatever the policy says of lost learners
        (learners(("FAILED", 1), RUNNING), ON_LOST, 1, S.FAILED, Action.FINALIZE, "code 1"),
        # one covered failure among others (a lost learner takes its peers down) retries
        (
            learners(("FAILED", 1), ("LOST", None)),
            ON_LOST,
            1,
            None,
            Action.RETRY,
            "learner 2 ended (lost)",
        ),
        # no policy: as before, no attempt named
        (
            learners(RUNNING, ("FAILED", 3)),
            None,
            1,
            S.FAILED,
            Action.FINALIZE,
            "learner 2 exited with code 3",
        ),
        # success is never retried
        (
            learners(("COMPLETED", 0), ("COMPLETED", 0)),
            ON_LOST,
            1,
            S.COMPLETED,
            Action.FINALIZE,
            None,
        ),
    ],
)
def test_decide_with_retries(
    observed: list[LearnerObservation],
    retries: Retries | None,
    attempt: int,
    state: TrainingState | None,
    action: Action,
    words: str | None,
) -> None:
    got_state, actions, message = run(observed, retries, attempt)
    assert got_state == state
    assert actions == (action,)
    if words is None:
        assert message is None
    else:
        assert message is not None and words in message
    if retries is None:
        assert message is not None and not message.startswith("attempt")


def test_a_timeout_is_not_retried_and_names_the_attempt() -> None:
    state, actions, message = run(
        learners(RUNNING, RUNNING),
        ON_LOST,
        2,
        started_at=NOW - timedelta(seconds=61),
        max_runtime=60,
    )
    assert (state, actions) == (S.FAILED, (Action.FINALIZE,))
    assert message is not None and message.startswith("attempt 2 of 3: timeout")


def test_a_stop_is_never_retried() -> None:
    state, _, message = run(learners(("LOST", None), ("HALTED", None)), ON_LOST, stop=True)
    assert (state, message) == (S.HALTED, "stopped by the user")


@pytest.mark.parametrize(
    ("policy", "expected"),
    [
        (None, None),
        ({}, None),
        (
            {"max_retries": 2, "retry_on_lost": True, "retry_on_exit_codes": [3, 7]},
            Retries(2, True, frozenset({3, 7})),
        ),
        ({"max_retries": 1}, Retries(1, False, frozenset())),
    ],
)
def test_the_policy_as_stored(policy: dict[str, object] | None, expected: Retries | None) -> None:
    assert Retries.of(policy) == expected


def test_shutdown_resumes_only_lost_covering_policies_with_attempts_left() -> None:
    assert ON_LOST.covers_shutdown(1) and ON_LOST.covers_shutdown(2)
    assert not ON_LOST.covers_shutdown(3)
    assert not ON_3.covers_shutdown(1)


@pytest.mark.parametrize(
    ("obs", "expected"),
    [
        (LearnerObservation(1, "LOST"), True),
        (LearnerObservation(1, "FAILED", -9), True),
        (LearnerObservation(1, "FAILED", -15), False),
        (LearnerObservation(1, "FAILED", 137), True),  # 128 + 9: a shell's or the sandbox's
        (LearnerObservation(1, "FAILED", 143), False),
        (LearnerObservation(1, "HALTED", -9), False),
        (LearnerObservation(1, "COMPLETED", 0), False),
    ],
)
def test_what_counts_as_lost(obs: LearnerObservation, expected: bool) -> None:
    assert lost(obs) is expected


@pytest.mark.parametrize("state", list(TrainingState))
def test_only_an_active_training_starts_again(state: TrainingState) -> None:
    if state in (S.PENDING, S.DOWNLOADING, S.RUNNING, S.STORING):
        check_restart(state)
    else:
        with pytest.raises(InvalidTransition):
            check_restart(state)


@pytest.mark.parametrize(
    ("key", "attempt"),
    [
        ("trainings/t1/checkpoints/attempt-2/model.ckpt", 2),
        ("trainings/t1/checkpoints/attempt-10/a/b", 10),
        ("trainings/t1/checkpoints/attempt-x/a", None),
        ("trainings/t1/checkpoints/other/a", None),
        ("trainings/t1/results/attempt-2/a", None),
        ("trainings/t2/checkpoints/attempt-2/a", None),
    ],
)
def test_checkpoint_keys_name_their_attempt(key: str, attempt: int | None) -> None:
    assert keys.checkpoint_attempt("t1", key) == attempt
    if attempt is not None:
        assert key.startswith(keys.attempt_checkpoints_prefix("t1", attempt))
