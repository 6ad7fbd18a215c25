"""The emulated cluster's scheduler (tests/k8s_emulator.py runs it after every change to
pods or nodes): each pod on no node, oldest first, is bound to the first node (by name)
whose labels its nodeSelector selects, whose NoSchedule/NoExecute taints it tolerates, that
is not cordoned, and where its requests fit what the node's bound pods leave of its
allocatable; one that fits no node is marked `PodScheduled=False`, reason `Unschedulable`.
A pod's requests: its containers' and sidecars' together, or its largest other init
container, whichever is more (per resource). Quantities are parsed by the official client.
Written from Kubernetes' documented rules, independently of the backend's own packing
(worker/backends/kubernetes/capacity.py), so that each checks the other.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from decimal import Decimal
from typing import Any

from kubernetes.utils import parse_quantity

_ENDED = ("Succeeded", "Failed")


class Scheduler:
    """The scheduler's decisions, with what it parsed kept: a pod's requests (by uid; a
    pod's containers do not change) and a node's allocatable (by name and version)."""

    def __init__(self) -> None:
        self._pods: dict[str, dict[str, Decimal]] = {}
        self._nodes: dict[str, tuple[str, dict[str, Decimal]]] = {}

    def allocatable(self, node: Mapping[str, Any]) -> dict[str, Decimal]:
        meta = node["metadata"]
        cached = self._nodes.get(meta["name"])
        if cached is None or cached[0] != meta.get("resourceVersion"):
            amounts = _quantities((node.get("status") or {}).get("allocatable"))
            cached = self._nodes[meta["name"]] = (meta.get("resourceVersion", ""), amounts)
        return cached[1]

    def requests_of(self, pod: Mapping[str, Any]) -> dict[str, Decimal]:
        uid = pod["metadata"].get("uid", "")
        if uid not in self._pods:
            self._pods[uid] = _pod_requests(pod)
        return self._pods[uid]

    def decide(
        self, nodes: Sequence[Mapping[str, Any]], pods: Sequence[tuple[Any, Mapping[str, Any]]]
    ) -> list[tuple[Any, dict[str, Any]]]:
        """The status (and nodeName) patches to make, by pod key: `nodes` sorted by name,
        `pods` (key, object) oldest first. Nothing without nodes."""
        waiting = [
            (key, pod)
            for key, pod in pods
            if not (pod.get("spec") or {}).get("nodeName")
            and not pod.get("metadata", {}).get("deletionTimestamp")
            and (pod.get("status") or {}).get("phase") not in _ENDED
        ]
        if not nodes or not waiting:
            return []
        free = {n["metadata"]["name"]: self.allocatable(n) for n in nodes}
        for _key, pod in pods:
            bound = (pod.get("spec") or {}).get("nodeName")
            if bound in free and (pod.get("status") or {}).get("phase") not in _ENDED:
                free[bound] = _less(free[bound], self.requests_of(pod))
        patches: list[tuple[Any, dict[str, Any]]] = []
        for key, pod in waiting:
            wants = self.requests_of(pod)
            chosen = next(
                (
                    n["metadata"]["name"]
                    for n in nodes
                    if _schedulable(pod, n) and _within(wants, free[n["metadata"]["name"]])
                ),
                None,
            )
            if chosen is not None:
                free[chosen] = _less(free[chosen], wants)
                patches.append((key, {
                    "spec": {"nodeName": chosen},
                    "status": {"conditions": [{"type": "PodScheduled", "status": "True"}]},
                }))  # fmt: skip
                continue
            conditions = (pod.get("status") or {}).get("conditions") or []
            if any(c.get("reason") == "Unschedulable" for c in conditions):
                continue
            message = f"0/{len(nodes)} nodes are available: insufficient resources."
            unschedulable = {"type": "PodScheduled", "status": "False",
                             "reason": "Unschedulable", "message": message}  # fmt: skip
            patches.append((key, {"status": {"conditions": [unschedulable]}}))
        return patches


def _quantities(values: Mapping[str, Any] | None) -> dict[str, Decimal]:
    return {name: parse_quantity(str(v)) for name, v in (values or {}).items()}


def _less(have: Mapping[str, Decimal], used: Mapping[str, Decimal]) -> dict[str, Decimal]:
    return {name: amount - used.get(name, Decimal(0)) for name, amount in have.items()}


def _within(wants: Mapping[str, Decimal], free: Mapping[str, Decimal]) -> bool:
    return all(amount <= free.get(name, Decimal(0)) for name, amount in wants.items() if amount)


def _container_requests(container: Mapping[str, Any]) -> dict[str, Decimal]:
    resources = container.get("resources") or {}
    return _quantities({**(resources.get("limits") or {}), **(resources.get("requests") or {})})


def _pod_requests(pod: Mapping[str, Any]) -> dict[str, Decimal]:
    """A pod's requests: its containers' and sidecars' together, or its largest other
    init container, whichever is more (per resource)."""
    spec = pod.get("spec") or {}
    total: dict[str, Decimal] = {}
    largest_init: dict[str, Decimal] = {}
    running = list(spec.get("containers") or [])
    for container in spec.get("initContainers") or []:
        if container.get("restartPolicy") == "Always":
            running.append(container)
        else:
            for name, amount in _container_requests(container).items():
                largest_init[name] = max(largest_init.get(name, Decimal(0)), amount)
    for container in running:
        for name, amount in _container_requests(container).items():
            total[name] = total.get(name, Decimal(0)) + amount
    return {n: max(total.get(n, Decimal(0)), largest_init.get(n, Decimal(0)))
            for n in set(total) | set(largest_init)}  # fmt: skip


def _schedulable(pod: Mapping[str, Any], node: Mapping[str, Any]) -> bool:
    """The node carries the labels the pod selects and its blocking taints are tolerated."""
    spec = pod.get("spec") or {}
    labels = node.get("metadata", {}).get("labels") or {}
    if any(labels.get(k) != v for k, v in (spec.get("nodeSelector") or {}).items()):
        return False
    if (node.get("spec") or {}).get("unschedulable"):
        return False
    tolerations = spec.get("tolerations") or []
    for taint in (node.get("spec") or {}).get("taints") or []:
        if taint.get("effect") not in ("NoSchedule", "NoExecute"):
            continue
        if not any(_tolerates(t, taint) for t in tolerations):
            return False
    return True


def _tolerates(toleration: Mapping[str, Any], taint: Mapping[str, Any]) -> bool:
    if toleration.get("effect") and toleration["effect"] != taint.get("effect"):
        return False
    if not toleration.get("key"):
        return toleration.get("operator") == "Exists"
    if toleration["key"] != taint.get("key"):
        return False
    return toleration.get("operator") == "Exists" or toleration.get("value", "") == taint.get(
        "value", ""
    )
