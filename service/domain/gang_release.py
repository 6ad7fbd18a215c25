"""Releasing a gang that cannot be placed (pure; the monitor applies it).

A training's learners start together or not at all. When the scheduler has bound some of
a training's pods and cannot place another (its pod's `PodScheduled` condition False,
reason `Unschedulable`), the bound ones hold their GPUs while waiting for a peer that may
never come: two such trainings on a full cluster wait for each other for ever. So a
learner unschedulable for longer than DLAAS_K8S_UNSCHEDULABLE_SECONDS while the gang has
not started (not every learner running yet) releases the whole gang: its pods are deleted
and the training goes back to QUEUED, once, as a new attempt; the second time it fails,
saying why.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, replace

from service.domain.lifecycle import LearnerObservation
from service.domain.retries import Retries

# The start of the status_message (and history entry) of a training queued again after
# its gang was released: what counts the releases a training had.
RELEASED = "released:"
# How many times a training is queued again before a release fails it.
MAX_RELEASES = 1
# The learner phases of a gang that has started: every learner got a node and runs.
_STARTED = frozenset({"RUNNING", "STORING", "COMPLETED"})


@dataclass(frozen=True)
class Unschedulable:
    """A learner whose pod the scheduler could not place, since `since` (epoch seconds)."""

    learner_id: int
    since: float


@dataclass(frozen=True)
class Release:
    """What to do with a gang that could not be placed: queue it again, or fail it."""

    requeue: bool
    message: str


def releases(events: Iterable[tuple[str, str | None]]) -> int:
    """How many times a training was released and queued again, from its history
    (status, message) pairs."""
    return sum(
        1
        for status, message in events
        if status == "QUEUED" and (message or "").startswith(RELEASED)
    )


def retries_after_releases(retries: Retries | None, released: int) -> Retries | None:
    """A training's retry policy, with the attempts its `released` gang releases took
    added: a release does not use up a retry (nor does it give one to a training whose
    manifest has no retry_policy)."""
    if retries is None or released <= 0:
        return retries
    return replace(retries, max_retries=retries.max_retries + released)


def gang_release(
    learners: Sequence[LearnerObservation],
    unschedulable: Sequence[Unschedulable],
    *,
    now: float,
    limit_seconds: float,
    released_before: int,
) -> Release | None:
    """The release of a training whose learners are `learners` and whose pods the
    scheduler could not place are `unschedulable`, if one is due at `now`: a learner
    unschedulable for `limit_seconds` or more while the gang has not started (and none
    of its learners ended: then the lifecycle decides). `released_before`: how many
    times the training was released already."""
    if not learners or all(obs.phase in _STARTED for obs in learners):
        return None
    if any(obs.ended for obs in learners):
        return None
    waiting = {obs.learner_id for obs in learners if obs.phase not in _STARTED}
    overdue = sorted(
        u.learner_id
        for u in unschedulable
        if u.learner_id in waiting and now - u.since >= limit_seconds
    )
    if not overdue:
        return None
    what = f"learner {overdue[0]} could not be scheduled for {limit_seconds:g} s"
    if released_before < MAX_RELEASES:
        return Release(requeue=True, message=f"{RELEASED} {what}; queued again")
    return Release(
        requeue=False,
        message=(
            f"{RELEASED} {what}, after it was queued again {released_before} time(s); "
            "failed: the cluster cannot place every learner at once"
        ),
    )
