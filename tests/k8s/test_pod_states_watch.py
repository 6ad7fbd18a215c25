"""Learner states from a watch, end to end through the official client: the test plays the
kubelet on the emulated API, a watch resumed from a list streams the pod's changes, and
each event's object (or a read pod, sanitized) is read as the learner's state."""

from __future__ import annotations

import time
from datetime import UTC, datetime, timedelta
from typing import Any

from kubernetes import client, watch

from tests.k8s.conftest import NAMESPACE
from worker.backends.kubernetes.pod_states import learner_observation

IMAGE = "dlaas/learner-tensorflow:2.21"
SELECTOR = "dlaas.io/training-id=training-abc"


def ts(offset: float) -> str:
    return (datetime.now(UTC) + timedelta(seconds=offset)).strftime("%Y-%m-%dT%H:%M:%SZ")


def learner_pod(learner_id: int) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": f"training-abc-{learner_id}",
            "labels": {
                "dlaas.io/training-id": "training-abc",
                "dlaas.io/tenant": "acme",
                "dlaas.io/learner-id": str(learner_id),
            },
        },
        "spec": {
            "restartPolicy": "Never",
            "activeDeadlineSeconds": 600,
            "initContainers": [
                {"name": "fetch", "image": IMAGE},
                {"name": "agent", "image": IMAGE, "restartPolicy": "Always"},
            ],
            "containers": [{"name": "learner", "image": IMAGE}],
        },
    }


def container(name: str, state: dict[str, Any]) -> dict[str, Any]:
    return {"name": name, "image": IMAGE, "ready": "running" in state, "restartCount": 0,
            "imageID": "", "state": state}  # fmt: skip


def kubelet_status(
    phase: str, fetch: dict[str, Any], agent: dict[str, Any], learner: dict[str, Any]
) -> dict[str, Any]:
    return {
        "status": {
            "phase": phase,
            "conditions": [{"type": "PodScheduled", "status": "True"}],
            "initContainerStatuses": [container("fetch", fetch), container("agent", agent)],
            "containerStatuses": [container("learner", learner)],
        }
    }


def run(at: float) -> dict[str, Any]:
    return {"running": {"startedAt": ts(at)}}


def end(code: int, started: float, finished: float, reason: str = "Completed") -> dict[str, Any]:
    return {
        "terminated": {
            "exitCode": code,
            "reason": reason,
            "startedAt": ts(started),
            "finishedAt": ts(finished),
        }
    }


WAIT = {"waiting": {"reason": "PodInitializing"}}


def observed_phases(core: client.CoreV1Api, since: str) -> list[tuple[str, int | None]]:
    out = []
    for event in watch.Watch().stream(
        core.list_namespaced_pod,
        NAMESPACE,
        label_selector=SELECTOR,
        resource_version=since,
        timeout_seconds=1,
    ):
        obs = learner_observation(
            event["raw_object"],
            time.time(),
            image_pull_timeout=300,
            deleted=event["type"] == "DELETED",
        )
        out.append((obs.phase, obs.exit_code))
    return out


def test_a_learner_through_its_phases(core: client.CoreV1Api) -> None:
    since = core.list_namespaced_pod(NAMESPACE, label_selector=SELECTOR).metadata.resource_version
    core.create_namespaced_pod(NAMESPACE, learner_pod(1))
    name = "training-abc-1"
    for status in (
        kubelet_status("Pending", run(-9), WAIT, WAIT),
        kubelet_status("Pending", end(0, -9, -8), run(-7), WAIT),
        kubelet_status("Running", end(0, -9, -8), run(-7), run(-6)),
        kubelet_status("Running", end(0, -9, -8), run(-7), end(0, -6, -3)),
        kubelet_status("Succeeded", end(0, -9, -8), end(0, -7, -1), end(0, -6, -3)),
    ):
        core.patch_namespaced_pod_status(name, NAMESPACE, status)
    core.delete_namespaced_pod(name, NAMESPACE)

    assert observed_phases(core, since) == [
        ("PENDING", None),
        ("DOWNLOADING", None),
        ("DOWNLOADING", None),
        ("RUNNING", None),
        ("STORING", None),
        ("COMPLETED", 0),
        ("COMPLETED", 0),  # deleted after it ended: the end stands
    ]


def test_oom_and_deletion_through_the_api(
    core: client.CoreV1Api, k8s_api: client.ApiClient
) -> None:
    since = core.list_namespaced_pod(NAMESPACE, label_selector=SELECTOR).metadata.resource_version
    core.create_namespaced_pod(NAMESPACE, learner_pod(1))
    core.create_namespaced_pod(NAMESPACE, learner_pod(2))
    core.patch_namespaced_pod_status(
        "training-abc-1",
        NAMESPACE,
        kubelet_status("Failed", end(0, -9, -8), end(0, -7, -1), end(137, -6, -2, "OOMKilled")),
    )
    core.patch_namespaced_pod_status(
        "training-abc-2", NAMESPACE, kubelet_status("Running", end(0, -9, -8), run(-7), run(-6))
    )
    # A read pod, as the client's models, reads the same once sanitized.
    read = k8s_api.sanitize_for_serialization(core.read_namespaced_pod("training-abc-1", NAMESPACE))
    oom = learner_observation(read, time.time(), image_pull_timeout=300)
    assert (oom.phase, oom.exit_code) == ("FAILED", 137)
    assert oom.message == "learner 1 was killed: out of memory (OOMKilled)"
    core.delete_namespaced_pod("training-abc-2", NAMESPACE)

    assert observed_phases(core, since) == [
        ("PENDING", None),
        ("PENDING", None),
        ("FAILED", 137),
        ("RUNNING", None),
        ("LOST", None),  # deleted while it ran
    ]


def test_a_running_learner_whose_pod_is_deleted_is_lost_at_once(core: client.CoreV1Api) -> None:
    body = learner_pod(1)
    body["spec"]["nodeName"] = "node-1"
    core.create_namespaced_pod(NAMESPACE, body)
    core.patch_namespaced_pod_status(
        "training-abc-1", NAMESPACE, kubelet_status("Running", end(0, -9, -8), run(-7), run(-6))
    )
    since = core.list_namespaced_pod(NAMESPACE, label_selector=SELECTOR).metadata.resource_version
    core.delete_namespaced_pod("training-abc-1", NAMESPACE, grace_period_seconds=30)
    # The kubelet's SIGTERM ends the learner (143), then the pod goes.
    core.patch_namespaced_pod_status(
        "training-abc-1",
        NAMESPACE,
        kubelet_status("Failed", end(0, -9, -8), end(0, -7, 1), end(143, -6, 1, "Error")),
    )
    core.delete_namespaced_pod("training-abc-1", NAMESPACE, grace_period_seconds=0)
    assert observed_phases(core, since) == [("LOST", None)] * 3
