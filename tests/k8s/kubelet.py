"""The kubelet, played by the tests: a learner pod's phase and its containers' states
(fetch, agent, learner), written through the status subresource as a kubelet writes them
(whole containerStatuses lists)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

from kubernetes import client

from tests.k8s.conftest import NAMESPACE


def ts(offset: float = 0.0) -> str:
    return (datetime.now(UTC) + timedelta(seconds=offset)).strftime("%Y-%m-%dT%H:%M:%SZ")


def cstatus(name: str, state: dict[str, Any], image: str = "img") -> dict[str, Any]:
    return {"name": name, "image": image, "imageID": "", "restartCount": 0,
            "ready": "running" in state, "state": state}  # fmt: skip


RUN = {"running": {"startedAt": ts(-5)}}
WAIT = {"waiting": {"reason": "PodInitializing"}}


def ended(code: int, reason: str = "Completed") -> dict[str, Any]:
    return {
        "terminated": {
            "exitCode": code,
            "reason": reason,
            "startedAt": ts(-4),
            "finishedAt": ts(-1),
        }
    }


def kubelet(
    core: client.CoreV1Api,
    name: str,
    phase: str,
    fetch: dict[str, Any],
    agent: dict[str, Any],
    learner: dict[str, Any],
    **extra: Any,
) -> None:
    status = {
        "phase": phase,
        "conditions": [{"type": "PodScheduled", "status": "True"}],
        "initContainerStatuses": [cstatus("fetch", fetch), cstatus("agent", agent)],
        "containerStatuses": [cstatus("learner", learner, extra.pop("image", "img"))],
        **extra,
    }
    core.patch_namespaced_pod_status(name, NAMESPACE, {"status": status})


def unschedulable(core: client.CoreV1Api, name: str, since: float = 0.0) -> None:
    """The scheduler's word on a pod it cannot place: Pending, `PodScheduled` False with
    reason Unschedulable since `since` seconds from now (negative: in the past)."""
    condition = {
        "type": "PodScheduled",
        "status": "False",
        "reason": "Unschedulable",
        "message": "0/4 nodes are available: 4 Insufficient nvidia.com/gpu.",
        "lastTransitionTime": ts(since),
    }
    core.patch_namespaced_pod_status(
        name, NAMESPACE, {"status": {"phase": "Pending", "conditions": [condition]}}
    )
