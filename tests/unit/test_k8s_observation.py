"""A training's Observation from the pods the watch holds (pure: pods as the API serves
them, the time passed in): the latest attempt's learners, primaries and attempt from the
labels, gone pods, and learners whose pod was never seen."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

import pytest

from worker.backends.kubernetes.observation import (
    MISSING_POD_GRACE_SECONDS,
    TrainingPods,
    observation,
)

CREATED = "2026-11-24T00:00:00Z"
T0 = datetime(2026, 11, 24, tzinfo=UTC).timestamp()


def pod(
    learner: int,
    *,
    attempt: int = 1,
    primary: bool = True,
    nodes: int = 2,
    learner_state: dict[str, Any] | None = None,
    phase: str = "Pending",
) -> dict[str, Any]:
    statuses = []
    if learner_state is not None:
        statuses = [{"name": "learner", "image": "img", "state": learner_state}]
    return {
        "metadata": {
            "name": f"learner-t-{learner}",
            "creationTimestamp": CREATED,
            "labels": {
                "dlaas.io/training-id": "t",
                "dlaas.io/learner-id": str(learner),
                "dlaas.io/attempt": str(attempt),
                "dlaas.io/primary": "true" if primary else "false",
            },
        },
        "spec": {
            "containers": [
                {"name": "learner", "env": [{"name": "NUM_LEARNERS", "value": str(nodes)}]}
            ]
        },
        "status": {"phase": phase, "containerStatuses": statuses},
    }


RUNNING = {"running": {"startedAt": CREATED}}
DONE = {"terminated": {"exitCode": 0, "finishedAt": CREATED, "startedAt": CREATED}}


def pods(*live: dict[str, Any], gone: tuple[dict[str, Any], ...] = ()) -> TrainingPods:
    return TrainingPods(
        {p["metadata"]["name"]: p for p in live}, {p["metadata"]["name"]: p for p in gone}
    )


def states(obs: Any) -> list[tuple[int, str]]:
    return [(lo.learner_id, lo.phase) for lo in obs.learners]


def test_learners_primaries_and_attempt_come_from_the_labels() -> None:
    obs = observation(
        pods(pod(1, learner_state=RUNNING), pod(2, primary=False)), T0 + 5, image_pull_timeout=60
    )
    assert states(obs) == [(1, "RUNNING"), (2, "PENDING")]
    assert (obs.primaries, obs.attempt) == ((1,), 1)


def named(p: dict[str, Any], name: str) -> dict[str, Any]:
    return {**p, "metadata": {**p["metadata"], "name": name}}


def test_only_the_latest_attempts_pods_count() -> None:
    old = named(pod(1, learner_state=RUNNING, phase="Running"), "attempt-1-of-learner-1")
    obs = observation(
        pods(old, pod(1, attempt=2), pod(2, attempt=2)), T0 + 5, image_pull_timeout=60
    )
    assert obs.attempt == 2
    assert states(obs) == [(1, "PENDING"), (2, "PENDING")]


@pytest.mark.parametrize(
    ("gone", "expected"),
    [
        (pod(2, learner_state=RUNNING, phase="Running"), "LOST"),  # deleted while it ran
        (pod(2, learner_state=DONE, phase="Succeeded"), "COMPLETED"),  # its end stands
    ],
)
def test_a_gone_pod_is_lost_unless_it_had_ended(gone: dict[str, Any], expected: str) -> None:
    obs = observation(pods(pod(1), gone=(gone,)), T0 + 5, image_pull_timeout=60)
    assert states(obs) == [(1, "PENDING"), (2, expected)]


def test_a_pod_never_seen_is_pending_while_the_start_is_recent_then_lost() -> None:
    one = pods(pod(1, nodes=3))
    soon = observation(one, T0 + 1, image_pull_timeout=60)
    assert states(soon) == [(1, "PENDING"), (2, "PENDING"), (3, "PENDING")]
    assert soon.learners[2].message == "learner 3's pod is being created"
    later = observation(one, T0 + MISSING_POD_GRACE_SECONDS + 1, image_pull_timeout=60)
    assert states(later) == [(1, "PENDING"), (2, "LOST"), (3, "LOST")]
