"""Nodes of the emulated cluster, as the GPU device plugin and GPU feature discovery
publish them: allocatable `nvidia.com/gpu`, CPU and memory, the product label, the
`nvidia.com/gpu` NoSchedule taint GPU nodes commonly carry."""

from __future__ import annotations

from typing import Any

from kubernetes import client

from service.domain.catalog import GPU_PRODUCT_LABEL, P100_PRODUCT


def node_body(
    name: str,
    *,
    gpus: int = 2,
    cpu: str = "64",
    memory: str = "256Gi",
    labels: dict[str, str] | None = None,
    taints: list[dict[str, str]] | None = None,
) -> dict[str, Any]:
    allocatable = {"cpu": cpu, "memory": memory, "pods": "110"}
    if gpus:
        allocatable["nvidia.com/gpu"] = str(gpus)
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {"name": name, "labels": {"kubernetes.io/hostname": name, **(labels or {})}},
        "spec": {"taints": taints or []},
        "status": {
            "allocatable": allocatable,
            "capacity": dict(allocatable),
            "conditions": [{"type": "Ready", "status": "True"}],
        },
    }


GPU_TAINT = {"key": "nvidia.com/gpu", "value": "present", "effect": "NoSchedule"}


def add_p100_nodes(core: client.CoreV1Api, count: int, gpus: int = 2) -> list[str]:
    """`count` nodes of `gpus` P100s each, labelled and tainted as GPU nodes are."""
    names = [f"p100-{i}" for i in range(count)]
    for name in names:
        core.create_node(
            node_body(name, gpus=gpus, labels={GPU_PRODUCT_LABEL: P100_PRODUCT}, taints=[GPU_TAINT])
        )
    return names
