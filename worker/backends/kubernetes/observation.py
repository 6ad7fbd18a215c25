"""A training's Observation from its pods as the watch's cache holds them (pure: plain
dicts, the time passed in): each pod read by pod_states, the learners of the latest
attempt only, the primaries and the attempt from the pods' labels, and a learner whose
pod was never seen PENDING while the training's start is recent, else LOST.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from service.domain.gang_release import Unschedulable
from service.domain.lifecycle import LearnerObservation
from worker.backends.base import Observation
from worker.backends.kubernetes import pod_states
from worker.backends.kubernetes.objects import ATTEMPT_LABEL, LEARNER_LABEL, PRIMARY_LABEL

# A training's pods are created one by one: one not seen this long after the newest of
# its others was created is missing (deleted while no backend watched), not on its way.
MISSING_POD_GRACE_SECONDS = 30.0

Pod = dict[str, Any]


@dataclass(frozen=True)
class TrainingPods:
    """What the cache holds of one training: its live pods and the last state of those that
    disappeared, by pod name."""

    live: Mapping[str, Pod] = field(default_factory=dict)
    gone: Mapping[str, Pod] = field(default_factory=dict)

    def __bool__(self) -> bool:
        return bool(self.live or self.gone)


def labels(obj: dict[str, Any]) -> dict[str, str]:
    """An object's labels (none where its metadata holds none, or not a mapping)."""
    found = obj.get("metadata", {}).get("labels")
    return found if isinstance(found, dict) else {}


def observation(pods: TrainingPods, now: float, image_pull_timeout: float) -> Observation:
    """The training's learners of its latest attempt, as its pods (live or gone) say."""
    everything = [(pod, False) for pod in pods.live.values()]
    everything += [(pod, True) for name, pod in pods.gone.items() if name not in pods.live]
    attempt = max((_int_label(pod, ATTEMPT_LABEL) or 1 for pod, _ in everything), default=1)
    current = [
        (pod, gone) for pod, gone in everything if (_int_label(pod, ATTEMPT_LABEL) or 1) == attempt
    ]
    learners: dict[int, LearnerObservation] = {}
    primaries: list[int] = []
    unschedulable: list[Unschedulable] = []
    expected = 0
    for pod, gone in current:
        lid = _int_label(pod, LEARNER_LABEL)
        if lid is None:
            continue
        since = None if gone else pod_states.unschedulable_since(pod)
        if since is not None:
            unschedulable.append(Unschedulable(lid, since))
        learners[lid] = pod_states.learner_observation(
            pod, now, image_pull_timeout=image_pull_timeout, deleted=gone, learner_id=lid
        )
        if labels(pod).get(PRIMARY_LABEL) == "true":
            primaries.append(lid)
        expected = max(expected, _num_learners(pod))
    # A learner whose pod the cache never saw: not created yet while a start is under way
    # (pods are created one by one), else deleted while no backend watched: lost.
    newest = max((_created_at(pod) for pod, _ in current), default=None)
    starting = newest is not None and now - newest < MISSING_POD_GRACE_SECONDS
    for lid in range(1, expected + 1):
        if lid not in learners:
            learners[lid] = (
                LearnerObservation(lid, "PENDING", None, f"learner {lid}'s pod is being created")
                if starting
                else pod_states.learner_observation(
                    None, now, image_pull_timeout=image_pull_timeout, learner_id=lid
                )
            )
    return Observation(
        learners=tuple(learners[lid] for lid in sorted(learners)),
        primaries=tuple(sorted(primaries)),
        attempt=attempt,
        unschedulable=tuple(sorted(unschedulable, key=lambda u: u.learner_id)),
    )


def _created_at(pod: Pod) -> float:
    created = pod_states.parse_time(pod.get("metadata", {}).get("creationTimestamp"))
    return 0.0 if created is None else created


def _int_label(pod: Pod, name: str) -> int | None:
    value = labels(pod).get(name)
    return int(value) if isinstance(value, str) and value.isdigit() else None


def _num_learners(pod: Pod) -> int:
    """NUM_LEARNERS from the learner container's environment (the learner contract)."""
    for container in pod.get("spec", {}).get("containers") or []:
        for var in container.get("env") or []:
            if var.get("name") == "NUM_LEARNERS" and str(var.get("value", "")).isdigit():
                return int(var["value"])
    return 0
