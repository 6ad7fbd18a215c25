"""The Kubernetes backend's admission hook: what fits the cluster now, from the node watch
(cluster_state.NodeWatch) and the pod watch's cache (pod_watch.PodWatch), with no API
call per pass.

The nodes' allocatable amounts less what the platform's bound pods request are packed
(capacity.Packing): first the learners of active trainings that are on no node yet
(admitted earlier, their pods not created or not scheduled yet), then, in admission
order, the queued trainings. Where the nodes cannot be read (no ClusterRole to list
them, or a cluster that reports none), DLAAS_K8S_SLOTS decides, as before; said once.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence

from kubernetes import client

from service.domain.admission import Candidate
from service.domain.catalog import ComputeSpec
from service.domain.names import label_value
from worker.backends.kubernetes.capacity import ClusterFit, Demand, Packing, Resources, Shape
from worker.backends.kubernetes.cluster_state import NodeWatch, pod_usage, resources_of
from worker.backends.kubernetes.objects import SIDECAR_REQUESTS
from worker.backends.kubernetes.pod_watch import PodWatch

log = logging.getLogger(__name__)

_ENDED_PHASES = ("Succeeded", "Failed")


class CapacityView:
    """The nodes and the platform's pods, as admission's Fit for one pass."""

    def __init__(
        self, core: client.CoreV1Api, pods: PodWatch, gpu_resource: str, sync_seconds: float
    ) -> None:
        self.nodes = NodeWatch(core, gpu_resource)
        self.pods = pods
        self.gpu_resource = gpu_resource
        self.sync_seconds = sync_seconds
        self.overhead = resources_of(SIDECAR_REQUESTS, gpu_resource)
        # Each pod's usage, parsed once per resourceVersion (by uid).
        self._usage: dict[str, tuple[str, tuple[str, Resources] | None]] = {}
        self._told: str | None = None

    def close(self) -> None:
        self.nodes.close()

    def _tell(self, why: str) -> None:
        if self._told != why:
            self._told = why
            log.warning("admission counts DLAAS_K8S_SLOTS, not the cluster's nodes: %s", why)

    def fit(
        self, active: Sequence[Candidate], computes: Mapping[str, ComputeSpec]
    ) -> ClusterFit | None:
        if not self.nodes.ensure_started(self.sync_seconds):
            self._tell(f"the nodes could not be listed in {self.sync_seconds:.0f} s")
            return None
        nodes = self.nodes.nodes()
        if not nodes:
            self._tell("the cluster reports no Ready node")
            return None
        self._told = None
        self.pods.ensure_started()
        used: dict[str, Resources] = {}
        placed: dict[str, int] = {}  # learners on a node (or ended), by training label
        seen: set[str] = set()
        for training in self.pods.trainings():
            for name, pod in self.pods.pods(training).live.items():
                meta = pod.get("metadata") or {}
                uid = str(meta.get("uid") or name)
                version = str(meta.get("resourceVersion") or "")
                seen.add(uid)
                cached = self._usage.get(uid)
                if cached is None or cached[0] != version:
                    cached = self._usage[uid] = (version, pod_usage(pod, self.gpu_resource))
                usage = cached[1]
                if usage is not None:
                    used[usage[0]] = used.get(usage[0], Resources()) + usage[1]
                if usage is not None or (pod.get("status") or {}).get("phase") in _ENDED_PHASES:
                    placed[training] = placed.get(training, 0) + 1
        for uid in set(self._usage) - seen:
            del self._usage[uid]
        shapes = {name: Shape.of(name, spec, self.overhead) for name, spec in computes.items()}
        packing = Packing(nodes, used)
        packing.reserve(
            Demand(c.training_id, shapes[c.compute], missing)
            for c in active
            if c.compute in shapes
            and (missing := c.nodes - placed.get(label_value(c.training_id), 0)) > 0
        )
        return ClusterFit(packing, shapes)
