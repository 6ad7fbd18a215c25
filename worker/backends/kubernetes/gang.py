"""The gang schedulers a cluster may already run, and what a training's objects carry for
them (pure: plain dicts, no client; the backend creates what these return).

DLAAS_K8S_GANG chooses:
- `none`: the platform's own admission decides when a training's learners start.
- `kueue`: the learners' pods form one Kueue pod group, as Kueue's plain-pod integration
  reads it: the labels `kueue.x-k8s.io/queue-name` (the LocalQueue,
  DLAAS_K8S_KUEUE_QUEUE) and `kueue.x-k8s.io/pod-group-name` (the training's prefix),
  and the annotation `kueue.x-k8s.io/pod-group-total-count` (the learners). Kueue's
  webhook gates the pods until the whole group fits its quota; the platform admits the
  training without counting capacity (`admits_without_capacity`).
- `coscheduling`: a scheduler-plugins `PodGroup` (`scheduling.x-k8s.io/v1alpha1`,
  `spec.minMember` = the learners, owned by the training's Service so it is deleted with
  it); the pods carry the label `scheduling.x-k8s.io/pod-group` and name the scheduler
  with the coscheduling plugin (DLAAS_K8S_SCHEDULER_NAME), which binds none of them
  until all fit.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

from service.settings import Settings

GangKind = Literal["none", "kueue", "coscheduling"]

KUEUE_QUEUE_LABEL = "kueue.x-k8s.io/queue-name"
KUEUE_GROUP_LABEL = "kueue.x-k8s.io/pod-group-name"
KUEUE_TOTAL_ANNOTATION = "kueue.x-k8s.io/pod-group-total-count"

POD_GROUP_GROUP = "scheduling.x-k8s.io"
POD_GROUP_VERSION = "v1alpha1"
POD_GROUP_PLURAL = "podgroups"
POD_GROUP_LABEL = "scheduling.x-k8s.io/pod-group"


@dataclass(frozen=True)
class GangConfig:
    """What the objects need of DLAAS_K8S_GANG and its settings."""

    kind: GangKind = "none"
    kueue_queue: str = "dlaas"
    scheduler_name: str = "scheduler-plugins-scheduler"

    @classmethod
    def from_settings(cls, settings: Settings) -> GangConfig:
        return cls(
            kind=settings.k8s_gang,
            kueue_queue=settings.k8s_kueue_queue,
            scheduler_name=settings.k8s_scheduler_name,
        )

    @property
    def admits_without_capacity(self) -> bool:
        """Whether a gang scheduler in the cluster, not the platform, decides when the
        learners fit: the platform then admits a training without counting capacity."""
        return self.kind != "none"


def gang_pod(pod: dict[str, Any], prefix: str, learners: int, gang: GangConfig) -> dict[str, Any]:
    """Learner pod `pod` (objects.learner_pod's) of the training named `prefix` with
    `learners` learners, as the gang scheduler `gang` reads it (a new dict; `none`
    returns it unchanged)."""
    if gang.kind == "none":
        return pod
    metadata = dict(pod["metadata"])
    spec = dict(pod["spec"])
    labels = dict(metadata.get("labels") or {})
    if gang.kind == "kueue":
        labels |= {KUEUE_QUEUE_LABEL: gang.kueue_queue, KUEUE_GROUP_LABEL: prefix}
        annotations = dict(metadata.get("annotations") or {})
        annotations[KUEUE_TOTAL_ANNOTATION] = str(learners)
        metadata["annotations"] = annotations
    else:
        labels[POD_GROUP_LABEL] = prefix
        spec["schedulerName"] = gang.scheduler_name
    metadata["labels"] = labels
    return {**pod, "metadata": metadata, "spec": spec}


def pod_group(
    prefix: str,
    namespace: str,
    learners: int,
    labels: dict[str, str],
    owner_references: list[dict[str, Any]],
) -> dict[str, Any]:
    """The scheduler-plugins PodGroup of a training's `learners` pods: named as its
    Service (`prefix`), owned by it, and schedulable only all together."""
    if learners < 1:
        raise ValueError("a pod group needs at least one member")
    return {
        "apiVersion": f"{POD_GROUP_GROUP}/{POD_GROUP_VERSION}",
        "kind": "PodGroup",
        "metadata": {
            "name": prefix,
            "namespace": namespace,
            "labels": dict(labels),
            "ownerReferences": [dict(ref) for ref in owner_references],
        },
        "spec": {"minMember": learners},
    }
