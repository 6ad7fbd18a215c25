"""The emulated cluster's nodes and scheduler (tests/k8s_emulator.py), and the node watch
admission reads them from (worker/backends/kubernetes/cluster_state.py)."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import Any

import pytest
from kubernetes import client
from kubernetes.client.rest import ApiException

from service.domain.admission import Candidate
from service.domain.catalog import DEFAULT_CATALOG
from tests.k8s.cluster import GPU_TAINT, add_p100_nodes, node_body
from tests.k8s.conftest import NAMESPACE
from worker.backends.kubernetes.capacity import Resources
from worker.backends.kubernetes.cluster_state import NodeWatch
from worker.backends.kubernetes.fitting import CapacityView
from worker.backends.kubernetes.pod_watch import PodWatch

P100_SELECTOR = {"nvidia.com/gpu.product": "Tesla-P100-PCIE-16GB"}
GPU_TOLERATION = {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}


def until(check: Callable[[], Any], timeout: float = 5.0) -> Any:
    deadline = time.monotonic() + timeout
    while not (value := check()):
        assert time.monotonic() < deadline, "the condition did not hold in time"
        time.sleep(0.02)
    return value


def gpu_pod(name: str, gpus: int = 1, tolerate: bool = True) -> dict[str, Any]:
    spec: dict[str, Any] = {
        "nodeSelector": P100_SELECTOR,
        "containers": [
            {
                "name": "learner",
                "image": "img",
                "resources": {
                    "requests": {"nvidia.com/gpu": str(gpus), "cpu": "1", "memory": "1Gi"},
                    "limits": {"nvidia.com/gpu": str(gpus), "cpu": "1", "memory": "1Gi"},
                },
            }
        ],
    }
    if tolerate:
        spec["tolerations"] = [GPU_TOLERATION]
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name}, "spec": spec}


def placement(core: client.CoreV1Api) -> dict[str, str | None]:
    """Each pod's node, or its PodScheduled=False reason."""
    out: dict[str, str | None] = {}
    for pod in core.list_namespaced_pod(NAMESPACE).items:
        reasons = [c.reason for c in pod.status.conditions or [] if c.status == "False"]
        out[pod.metadata.name] = pod.spec.node_name or (reasons[0] if reasons else None)
    return out


def test_the_scheduler_binds_pods_that_fit_and_marks_the_rest_unschedulable(
    core: client.CoreV1Api,
) -> None:
    add_p100_nodes(core, 2, gpus=2)
    for i in range(3):
        core.create_namespaced_pod(NAMESPACE, gpu_pod(f"a{i}"))
    core.create_namespaced_pod(NAMESPACE, gpu_pod("big", gpus=2))
    core.create_namespaced_pod(NAMESPACE, gpu_pod("untolerated", tolerate=False))
    assert placement(core) == {
        "a0": "p100-0",
        "a1": "p100-0",
        "a2": "p100-1",
        "big": "Unschedulable",  # 1 GPU left on p100-1
        "untolerated": "Unschedulable",  # the GPU taint
    }
    # A learner that ends frees its GPU; deleting one frees it too: the waiting pod binds.
    core.patch_namespaced_pod_status("a2", NAMESPACE, {"status": {"phase": "Succeeded"}})
    assert placement(core)["big"] == "p100-1"


def test_without_nodes_nothing_is_scheduled(core: client.CoreV1Api) -> None:
    core.create_namespaced_pod(NAMESPACE, gpu_pod("a"))
    assert placement(core) == {"a": None}


def test_the_node_watch_lists_then_follows_the_nodes(core: client.CoreV1Api) -> None:
    add_p100_nodes(core, 2, gpus=2)
    watch = NodeWatch(core, "nvidia.com/gpu")
    try:
        assert watch.ensure_started(10)
        assert sorted(n.name for n in watch.nodes()) == ["p100-0", "p100-1"]
        assert watch.nodes()[0].allocatable == Resources(2, 64_000, 256 << 30)
        core.create_node(node_body("p100-2", gpus=4, taints=[GPU_TAINT]))
        until(lambda: len(watch.nodes()) == 3)
        core.patch_node("p100-0", {"spec": {"unschedulable": True}})
        until(lambda: any(n.unschedulable for n in watch.nodes()))
        core.delete_node("p100-1")
        until(lambda: sorted(n.name for n in watch.nodes()) == ["p100-0", "p100-2"])
        assert watch.lists == 1  # followed, not listed again
    finally:
        watch.close()


def test_what_fits_follows_the_pods_between_passes(core: client.CoreV1Api) -> None:
    """What bound pods hold is updated for the trainings whose pods changed: a pod that
    ends or is deleted frees its node for the next pass, one bound takes it."""
    add_p100_nodes(core, 2, gpus=2)
    computes = DEFAULT_CATALOG.compute_configurations
    pods = PodWatch(core, NAMESPACE)
    view = CapacityView(core, pods, "nvidia.com/gpu", 10)

    def fit_now() -> int:
        fit = view.fit([], computes)
        assert fit is not None
        return fit.packing.fit_now(fit.shapes["P100"])

    def labelled(name: str, training: str) -> dict[str, Any]:
        body = gpu_pod(name)
        body["metadata"]["labels"] = {"dlaas.io/training-id": training}
        return body

    try:
        assert fit_now() == 4
        for i in range(3):
            core.create_namespaced_pod(NAMESPACE, labelled(f"t1-{i}", "t1"))
        until(lambda: fit_now() == 1)
        core.patch_namespaced_pod_status("t1-0", NAMESPACE, {"status": {"phase": "Succeeded"}})
        until(lambda: fit_now() == 2)
        core.delete_namespaced_pod("t1-1", NAMESPACE, grace_period_seconds=0)
        until(lambda: fit_now() == 3)
        # A training admitted whose pods are not there yet counts as taken.
        fit = view.fit([Candidate("t2", "x", 2, "P100")], computes)
        assert fit is not None and fit.packing.fit_now(fit.shapes["P100"]) == 1
    finally:
        view.close()
        pods.close()


class _Forbidden:
    """A CoreV1Api whose credentials may not list the nodes (no ClusterRole)."""

    def __init__(self) -> None:
        self.calls = 0

    def list_node(self, **_: Any) -> Any:
        self.calls += 1
        raise ApiException(status=403, reason="Forbidden")


def test_nodes_that_may_not_be_read_leave_admission_to_the_slots_said_once(
    caplog: pytest.LogCaptureFixture,
) -> None:
    core = _Forbidden()
    watch = NodeWatch(core, "nvidia.com/gpu")  # type: ignore[arg-type]
    try:
        with caplog.at_level(logging.WARNING):
            assert not watch.ensure_started(0.3)
            assert not watch.ensure_started(0.3)
        # Tried once, then waits FORBIDDEN_RETRY_SECONDS (not a retry a second).
        assert core.calls == 1
        said = [r.getMessage() for r in caplog.records if "may not be listed" in r.getMessage()]
        assert len(said) == 1 and "DLAAS_K8S_SLOTS" in said[0]
    finally:
        watch.close()
