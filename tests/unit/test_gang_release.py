"""When a gang the cluster cannot place is released (service.domain.gang_release), and the
state machine's way back to QUEUED (service.domain.states.check_requeue): table-tested."""

from __future__ import annotations

import pytest

from service.domain.gang_release import (
    RELEASED,
    Release,
    Unschedulable,
    gang_release,
    releases,
    retries_after_releases,
)
from service.domain.lifecycle import LearnerObservation
from service.domain.retries import Retries
from service.domain.states import InvalidTransition, TrainingState, check_requeue

NOW = 10_000.0
LIMIT = 300.0


def learners(*phases: str) -> list[LearnerObservation]:
    return [LearnerObservation(i, phase) for i, phase in enumerate(phases, start=1)]


REQUEUED = Release(
    requeue=True, message="released: learner 2 could not be scheduled for 300 s; queued again"
)


@pytest.mark.parametrize(
    ("phases", "unschedulable", "released_before", "expected"),
    [
        # Learner 2 unschedulable past the limit while learner 1 runs: released, queued.
        (("RUNNING", "PENDING"), [Unschedulable(2, NOW - 301)], 0, REQUEUED),
        (("DOWNLOADING", "PENDING"), [Unschedulable(2, NOW - LIMIT)], 0, REQUEUED),
        # The lowest learner past the limit is the one named.
        (
            ("PENDING", "PENDING", "PENDING"),
            [Unschedulable(3, NOW - 900), Unschedulable(2, NOW - 400)],
            0,
            Release(True, "released: learner 2 could not be scheduled for 300 s; queued again"),
        ),
        # Not yet past the limit.
        (("RUNNING", "PENDING"), [Unschedulable(2, NOW - 299)], 0, None),
        # Nothing unschedulable: pods being created, images pulled.
        (("RUNNING", "PENDING"), [], 0, None),
        # The gang started (every learner runs): nothing to release.
        (("RUNNING", "RUNNING"), [Unschedulable(2, NOW - 900)], 0, None),
        (("STORING", "COMPLETED"), [], 0, None),
        # A learner ended: the lifecycle decides (failure, retries), not a release.
        (("FAILED", "PENDING"), [Unschedulable(2, NOW - 900)], 0, None),
        (("LOST", "PENDING"), [Unschedulable(2, NOW - 900)], 0, None),
        # An unschedulable report of a learner already running is stale: ignored.
        (("RUNNING", "PENDING"), [Unschedulable(1, NOW - 900)], 0, None),
        ((), [Unschedulable(1, NOW - 900)], 0, None),
        # Queued again once already: the second release fails it, naming why.
        (
            ("RUNNING", "PENDING"),
            [Unschedulable(2, NOW - 301)],
            1,
            Release(
                False,
                "released: learner 2 could not be scheduled for 300 s, after it was queued "
                "again 1 time(s); failed: the cluster cannot place every learner at once",
            ),
        ),
    ],
)
def test_gang_release(
    phases: tuple[str, ...],
    unschedulable: list[Unschedulable],
    released_before: int,
    expected: Release | None,
) -> None:
    got = gang_release(
        learners(*phases),
        unschedulable,
        now=NOW,
        limit_seconds=LIMIT,
        released_before=released_before,
    )
    assert got == expected


@pytest.mark.parametrize(
    ("events", "count"),
    [
        ([("QUEUED", None)], 0),
        ([("QUEUED", None), ("PENDING", "starting 2 learner(s)")], 0),
        ([("QUEUED", None), ("PENDING", None), ("QUEUED", f"{RELEASED} learner 2 ...")], 1),
        # Another way of being queued (none today) does not count; nor a failure's message.
        ([("QUEUED", "waiting: the plan allows 4"), ("FAILED", f"{RELEASED} x")], 0),
        ([("QUEUED", f"{RELEASED} a"), ("PENDING", None), ("QUEUED", f"{RELEASED} b")], 2),
    ],
)
def test_releases_are_counted_from_the_history(
    events: list[tuple[str, str | None]], count: int
) -> None:
    assert releases(events) == count


@pytest.mark.parametrize("state", [TrainingState.PENDING, TrainingState.DOWNLOADING])
def test_a_training_whose_learners_have_not_all_started_may_be_queued_again(
    state: TrainingState,
) -> None:
    check_requeue(state)


@pytest.mark.parametrize(
    "state",
    [
        TrainingState.QUEUED,
        TrainingState.RUNNING,
        TrainingState.STORING,
        TrainingState.COMPLETED,
        TrainingState.FAILED,
        TrainingState.HALTED,
    ],
)
def test_a_started_queued_or_ended_training_is_not_queued_again(state: TrainingState) -> None:
    with pytest.raises(InvalidTransition, match="QUEUED"):
        check_requeue(state)


@pytest.mark.parametrize(
    ("retries", "released", "expected"),
    [
        (None, 0, None),
        # No retry_policy: a release gives none.
        (None, 1, None),
        (Retries(max_retries=1, on_lost=True), 0, Retries(max_retries=1, on_lost=True)),
        # The attempt a release took is added: the policy's retries are all still there.
        (Retries(max_retries=1, on_lost=True), 1, Retries(max_retries=2, on_lost=True)),
        (
            Retries(max_retries=0, on_exit_codes=frozenset({3})),
            1,
            Retries(max_retries=1, on_exit_codes=frozenset({3})),
        ),
    ],
)
def test_a_release_does_not_use_up_a_retry(
    retries: Retries | None, released: int, expected: Retries | None
) -> None:
    assert retries_after_releases(retries, released) == expected
