"""Gang admission from the cluster's real capacity: the platform on the emulated cluster
(nodes with allocatable GPUs, a scheduler that binds pods to nodes that fit), the monitor
admitting a training only when every learner fits the nodes now."""

from __future__ import annotations

import json
from typing import Any

from fastapi.testclient import TestClient
from kubernetes import client

from service.dispatch import LAUNCH
from service.platform import Platform
from tests.conftest import create_tenant, submit
from tests.k8s.cluster import add_p100_nodes
from tests.k8s.conftest import NAMESPACE
from tests.k8s.kubelet import RUN, ended, kubelet
from tests.k8s.test_platform import Outbox, k8s_backend, settings, until  # noqa: F401
from tests.manifest_cases import base
from worker import execution
from worker.backends.kubernetes.backend import KubernetesBackend
from worker.backends.kubernetes.gang import GangConfig
from worker.monitor import Monitor


def submit_p100(client: TestClient, tenant: str, learners: int) -> tuple[dict[str, str], str]:
    headers = create_tenant(client, tenant)
    manifest = base(
        framework={"name": "tensorflow-horovod", "version": "2.21"},
        compute_configuration={"name": "P100", "nodes": learners},
    )
    r = submit(client, headers, json.dumps(manifest))
    assert r.status_code == 201, r.text
    return headers, r.json()["id"]


def pods_of(core: client.CoreV1Api, training_id: str) -> list[Any]:
    selector = f"dlaas.io/training-id={training_id}"
    return list(core.list_namespaced_pod(NAMESPACE, label_selector=selector).items)


def test_of_two_6_learner_trainings_on_8_gpus_one_starts_whole_and_the_other_waits(
    client: TestClient,
    platform: Platform,
    core: client.CoreV1Api,
    k8s_backend: tuple[Outbox, KubernetesBackend],  # noqa: F811
) -> None:
    outbox, backend = k8s_backend
    add_p100_nodes(core, 4, gpus=2)  # 8 P100s
    first_headers, first = submit_p100(client, "acme", 6)
    second_headers, second = submit_p100(client, "globex", 6)
    monitor = Monitor(platform, backend)

    monitor.tick()
    assert outbox.sent == [(LAUNCH, first)]
    waiting = client.get(f"/v1/trainings/{second}", headers=second_headers).json()
    assert waiting["status"] == "QUEUED"
    assert waiting["status_message"] == "waiting: needs 6 × P100 learners; 2 fit now"  # noqa: RUF001

    execution.launch(platform, backend, first)
    # The scheduler bound every learner of the first: the gang started whole.
    until(lambda: all(p.spec.node_name for p in pods_of(core, first)))
    placed = pods_of(core, first)
    assert len(placed) == 6
    assert all(
        c.type != "PodScheduled" or c.status == "True"
        for p in placed
        for c in p.status.conditions or []
    )

    # While the first runs, the second stays QUEUED and has no pod.
    for p in placed:
        kubelet(core, p.metadata.name, "Running", ended(0), RUN, RUN)
    until(lambda: [lo.phase for lo in backend.observe(first).learners] == ["RUNNING"] * 6)  # type: ignore[union-attr]
    for _ in range(2):
        monitor.tick()
    assert outbox.sent == [(LAUNCH, first)]
    waiting = client.get(f"/v1/trainings/{second}", headers=second_headers).json()
    assert (waiting["status"], waiting["status_message"]) == (
        "QUEUED",
        "waiting: needs 6 × P100 learners; 2 fit now",  # noqa: RUF001
    )
    assert pods_of(core, second) == []

    # The first completes: the second is admitted, and all of its learners are bound.
    for p in placed:
        kubelet(core, p.metadata.name, "Succeeded", ended(0), ended(0), ended(0))
    until(lambda: [lo.phase for lo in backend.observe(first).learners] == ["COMPLETED"] * 6)  # type: ignore[union-attr]
    monitor.tick()
    assert client.get(f"/v1/trainings/{first}", headers=first_headers).json()["status"] == (
        "COMPLETED"
    )
    monitor.tick()
    assert outbox.sent[-1] == (LAUNCH, second)
    started = client.get(f"/v1/trainings/{second}", headers=second_headers).json()
    assert started["status"] == "PENDING"
    assert not (started["status_message"] or "").startswith("waiting:")
    execution.launch(platform, backend, second)
    until(lambda: len(pods_of(core, second)) == 6)
    until(lambda: all(p.spec.node_name for p in pods_of(core, second)))


def test_a_training_larger_than_the_matching_nodes_could_ever_hold_fails_naming_its_configuration(
    client: TestClient,
    platform: Platform,
    core: client.CoreV1Api,
    k8s_backend: tuple[Outbox, KubernetesBackend],  # noqa: F811
) -> None:
    outbox, backend = k8s_backend
    add_p100_nodes(core, 4, gpus=2)
    headers, too_big = submit_p100(client, "acme", 9)
    _, fits = submit_p100(client, "globex", 2)
    Monitor(platform, backend).tick()
    failed = client.get(f"/v1/trainings/{too_big}", headers=headers).json()
    assert failed["status"] == "FAILED"
    assert "compute configuration P100" in failed["status_message"]
    assert "hold 8 at most" in failed["status_message"]
    # It does not hold back the queue behind it.
    assert outbox.sent == [(LAUNCH, fits)]


def test_without_readable_nodes_the_slots_decide(
    client: TestClient,
    platform: Platform,
    k8s_backend: tuple[Outbox, KubernetesBackend],  # noqa: F811
) -> None:
    """A cluster that reports no node (or none the platform may list): DLAAS_K8S_SLOTS."""
    outbox, backend = k8s_backend
    _, a = submit_p100(client, "acme", 6)
    _, b = submit_p100(client, "globex", 6)
    Monitor(platform, backend).tick()
    assert outbox.sent == [(LAUNCH, a), (LAUNCH, b)]


def test_with_a_gang_scheduler_the_platforms_capacity_check_steps_aside(
    client: TestClient,
    platform: Platform,
    core: client.CoreV1Api,
    k8s_backend: tuple[Outbox, KubernetesBackend],  # noqa: F811
) -> None:
    """DLAAS_K8S_GANG other than none: the cluster's gang scheduler admits (the slots
    bound what is sent to it), not the platform's packing."""
    outbox, backend = k8s_backend
    backend.gang = GangConfig(kind="kueue")
    add_p100_nodes(core, 4, gpus=2)
    _, a = submit_p100(client, "acme", 6)
    _, b = submit_p100(client, "globex", 6)
    Monitor(platform, backend).tick()
    assert outbox.sent == [(LAUNCH, a), (LAUNCH, b)]
