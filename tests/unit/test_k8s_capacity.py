"""The capacity packing (worker/backends/kubernetes/capacity.py, pure) and how the
cluster's objects are read as its numbers (cluster_state), table-tested."""

from __future__ import annotations

from typing import Any

import pytest

from service.domain.admission import Candidate, admit
from service.domain.catalog import DEFAULT_CATALOG, Toleration
from worker.backends.base import FitsCapacity
from worker.backends.kubernetes.capacity import (
    ClusterFit,
    Demand,
    Node,
    Packing,
    Resources,
    Shape,
    Taint,
    matches,
    tolerates,
)
from worker.backends.kubernetes.cluster_state import node_of, pod_requests, pod_usage
from worker.backends.local import LocalBackend

GIB = 1 << 30
P100 = DEFAULT_CATALOG.compute_configurations["P100"]
P100X2 = DEFAULT_CATALOG.compute_configurations["P100x2"]
K80 = DEFAULT_CATALOG.compute_configurations["K80"]
GPU_TAINT = Taint("nvidia.com/gpu", "present", "NoSchedule")


def gpu_node(
    name: str,
    gpus: int,
    product: str = "Tesla-P100-PCIE-16GB",
    *,
    cpu: int = 64_000,
    memory_gib: int = 256,
    taints: tuple[Taint, ...] = (GPU_TAINT,),
    **kw: Any,
) -> Node:
    return Node(
        name,
        Resources(gpus, cpu, memory_gib * GIB),
        {"nvidia.com/gpu.product": product},
        taints,
        **kw,
    )


def shape(name: str = "P100") -> Shape:
    return Shape.of(name, DEFAULT_CATALOG.compute_configurations[name])


@pytest.mark.parametrize(
    ("toleration", "taint", "expected"),
    [
        (Toleration(key="nvidia.com/gpu", operator="Exists"), GPU_TAINT, True),
        (Toleration(key="nvidia.com/gpu", operator="Exists", effect="NoSchedule"), GPU_TAINT, True),
        (Toleration(key="nvidia.com/gpu", operator="Exists", effect="NoExecute"), GPU_TAINT, False),
        (Toleration(key="nvidia.com/gpu", operator="Equal", value="present"), GPU_TAINT, True),
        (Toleration(key="nvidia.com/gpu", operator="Equal", value="other"), GPU_TAINT, False),
        (Toleration(key="dedicated", operator="Exists"), GPU_TAINT, False),
        (Toleration(operator="Exists"), GPU_TAINT, True),
    ],
)
def test_a_toleration_tolerates_a_taint_by_kubernetes_rules(
    toleration: Toleration, taint: Taint, expected: bool
) -> None:
    assert tolerates([toleration], taint) is expected


@pytest.mark.parametrize(
    ("node", "expected"),
    [
        (gpu_node("a", 2), True),
        (gpu_node("a", 2, product="Tesla-K80"), False),  # another GPU: the label differs
        (gpu_node("a", 2, unschedulable=True), False),  # cordoned
        # A taint P100 does not tolerate.
        (gpu_node("a", 2, taints=(GPU_TAINT, Taint("dedicated", "a", "NoSchedule"))), False),
        # Only preferred.
        (gpu_node("a", 2, taints=(Taint("dedicated", "a", "PreferNoSchedule"),)), True),
    ],
)  # fmt: skip
def test_a_node_matches_a_configuration_by_its_labels_taints_and_cordon(
    node: Node, expected: bool
) -> None:
    assert matches(node, shape()) is expected


def test_a_gang_is_placed_whole_or_not_at_all_and_what_it_takes_is_taken() -> None:
    packing = Packing([gpu_node(f"n{i}", 2) for i in range(4)], {})
    first = packing.place(Demand("a", shape(), 6))
    assert (first.placed, first.fit_now, first.fit_ever) == (True, 6, 8)
    second = packing.place(Demand("b", shape(), 6))
    assert (second.placed, second.needed, second.fit_now, second.never) == (False, 6, 2, False)
    # Nothing was taken by the one that did not fit: 2 still fit.
    assert packing.fit_now(shape()) == 2
    assert packing.place(Demand("c", shape(), 2)).placed
    assert packing.fit_now(shape()) == 0


@pytest.mark.parametrize(
    ("nodes", "used", "name", "count", "placed", "fit_now", "fit_ever"),
    [
        # CPU binds before the GPUs: 8-CPU learners on 12 CPUs, 1 each.
        ([gpu_node("a", 2, cpu=12_000)], {}, "P100", 2, False, 1, 1),
        # Memory binds: 24 GiB learners on 40 GiB.
        ([gpu_node("a", 4, memory_gib=40)], {}, "P100", 2, False, 1, 1),
        # What bound pods request is not free.
        ([gpu_node("a", 2), gpu_node("b", 2)], {"a": Resources(1, 8000, 24 * GIB)},
         "P100", 3, True, 3, 4),
        # Two GPUs a learner: a node of 3 holds one.
        ([gpu_node("a", 3), gpu_node("b", 3)], {}, "P100x2", 2, True, 2, 2),
        # No node of that product: never.
        ([gpu_node("a", 8)], {}, "K80", 1, False, 0, 0),
    ],
)  # fmt: skip
def test_learners_are_packed_within_every_resource(
    nodes: list[Node],
    used: dict[str, Resources],
    name: str,
    count: int,
    placed: bool,
    fit_now: int,
    fit_ever: int,
) -> None:
    verdict = Packing(nodes, used).place(Demand("t", shape(name), count))
    assert (verdict.placed, verdict.fit_now, verdict.fit_ever) == (placed, fit_now, fit_ever)


def test_unbound_learners_of_active_trainings_are_reserved_largest_first() -> None:
    """Two 2-GPU learners and two 1-GPU learners admitted earlier, not bound yet, on two
    3-GPU nodes: first fit decreasing places the 2-GPU ones first (one a node), then the
    1-GPU ones in what is left; nothing is free after."""
    packing = Packing([gpu_node("a", 3), gpu_node("b", 3)], {})
    packing.reserve([Demand("small", shape("P100"), 2), Demand("large", shape("P100x2"), 2)])
    assert packing.free_on("a").gpus == 0 and packing.free_on("b").gpus == 0
    assert packing.fit_now(shape("P100")) == 0


def test_admission_weighs_each_training_against_what_earlier_ones_took() -> None:
    packing = Packing([gpu_node(f"n{i}", 2) for i in range(4)], {})
    fit = ClusterFit(packing, {"P100": shape()})
    queued = [
        Candidate("a", "t1", 4, "P100"),
        Candidate("b", "t2", 3, "P100"),
        Candidate("c", "t3", 6, "P100"),  # waits: 1 fits now
        Candidate("d", "t4", 1, "P100"),  # behind it: gang order, not backfilled
    ]
    result = admit(
        queued,
        active_per_tenant={},
        concurrency_per_tenant={t: 5 for t in ("t1", "t2", "t3", "t4")},
        free_slots=0,  # the slots are not asked where the backend fits
        fit=fit,
    )
    assert result.started == ["a", "b"]
    assert result.waiting_on_capacity == {"c": "needs 6 × P100 learners; 1 fit now"}  # noqa: RUF001


@pytest.mark.parametrize(
    ("learners", "compute", "never"),
    [
        (8, "P100", None),
        (9, "P100", "capacity: 9 learners of compute configuration P100 can never fit this "
                    "cluster: its nodes that match P100 hold 8 at most"),
        (1, "K80", "capacity: 1 learners of compute configuration K80 can never fit this "
                   "cluster: its nodes that match K80 hold 0 at most"),
        (50, "gone", None),  # a configuration no longer offered: the launch says so
    ],
)  # fmt: skip
def test_a_training_the_matching_nodes_can_never_hold_is_named(
    learners: int, compute: str, never: str | None
) -> None:
    packing = Packing([gpu_node(f"n{i}", 2) for i in range(4)], {"n0": Resources(2, 0, 0)})
    fit = ClusterFit(packing, {"P100": shape(), "K80": shape("K80")})
    assert fit.never(Candidate("t", "x", learners, compute)) == never


def test_a_learner_shape_counts_the_agent_sidecar() -> None:
    overhead = Resources(0, 100, 128 << 20)
    assert Shape.of("P100", P100, overhead).requests == Resources(1, 8100, 24 * GIB + (128 << 20))


def _c(cpu: str, memory: str, gpus: str | None = None, **extra: Any) -> dict[str, Any]:
    requests = {"cpu": cpu, "memory": memory} | ({"nvidia.com/gpu": gpus} if gpus else {})
    return {"name": "c", "resources": {"requests": requests}, **extra}


@pytest.mark.parametrize(
    ("spec", "expected"),
    [
        ({"containers": [_c("8", "24Gi", "1")]}, Resources(1, 8000, 24 * GIB)),
        ({"containers": [_c("500m", "1Gi"), _c("1500m", "1Gi")]}, Resources(0, 2000, 2 * GIB)),
        # A sidecar (restartPolicy Always) runs beside the app containers.
        ({"initContainers": [_c("100m", "128Mi"), _c("100m", "128Mi", restartPolicy="Always")],
          "containers": [_c("8", "24Gi", "1")]},
         Resources(1, 8100, 24 * GIB + (128 << 20))),
        # An init container larger than the app containers sets the request.
        ({"initContainers": [_c("4", "64Gi")], "containers": [_c("1", "1Gi")]},
         Resources(0, 4000, 64 * GIB)),
        # A limit without a request requests the limit.
        ({"containers": [{"name": "c", "resources": {"limits": {"cpu": "2", "memory": "1Gi"}}}]},
         Resources(0, 2000, GIB)),
    ],
)  # fmt: skip
def test_a_pods_effective_requests(spec: dict[str, Any], expected: Resources) -> None:
    assert pod_requests(spec, "nvidia.com/gpu") == expected


def test_only_bound_pods_that_run_hold_their_node() -> None:
    spec = {"containers": [_c("1", "1Gi", "1")]}
    assert pod_usage({"spec": spec, "status": {"phase": "Pending"}}, "nvidia.com/gpu") is None
    bound = {"spec": {**spec, "nodeName": "n1"}, "status": {"phase": "Running"}}
    assert pod_usage(bound, "nvidia.com/gpu") == ("n1", Resources(1, 1000, GIB))
    ended = {"spec": {**spec, "nodeName": "n1"}, "status": {"phase": "Succeeded"}}
    assert pod_usage(ended, "nvidia.com/gpu") is None


def test_a_node_object_is_read_with_its_allocatable_labels_and_taints() -> None:
    obj = {
        "metadata": {"name": "n1", "labels": {"nvidia.com/gpu.product": "Tesla-P100-PCIE-16GB"}},
        "spec": {"taints": [{"key": "nvidia.com/gpu", "value": "present", "effect": "NoSchedule"}]},
        "status": {
            "allocatable": {"cpu": "63500m", "memory": "250Gi", "nvidia.com/gpu": "2"},
            "conditions": [{"type": "Ready", "status": "True"}],
        },
    }
    node = node_of(obj, "nvidia.com/gpu")
    assert node == Node(
        "n1",
        Resources(2, 63_500, 250 * GIB),
        {"nvidia.com/gpu.product": "Tesla-P100-PCIE-16GB"},
        (GPU_TAINT,),
    )
    obj["status"]["conditions"] = [{"type": "Ready", "status": "False"}]
    assert node_of(obj, "nvidia.com/gpu") is None


def test_the_local_backend_keeps_its_slots() -> None:
    assert not issubclass(LocalBackend, FitsCapacity)
