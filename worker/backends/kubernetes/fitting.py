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
from worker.backends.kubernetes.capacity import (
    ClusterFit,
    Demand,
    NodeIndex,
    Packing,
    Resources,
    Shape,
)
from worker.backends.kubernetes.cluster_state import NodeWatch, pod_usage, resources_of
from worker.backends.kubernetes.objects import SIDECAR_REQUESTS
from worker.backends.kubernetes.pod_watch import PodWatch

log = logging.getLogger(__name__)

_ENDED_PHASES = ("Succeeded", "Failed")


class CapacityView:
    """The nodes and the platform's pods, as admission's Fit for one pass. What the
    bound pods hold per node is kept between passes and updated for the trainings whose
    pods changed (PodWatch.changed_since); what follows from the nodes alone (their order,
    which match each configuration, how many each could hold) until the nodes change."""

    def __init__(
        self, core: client.CoreV1Api, pods: PodWatch, gpu_resource: str, sync_seconds: float
    ) -> None:
        self.nodes = NodeWatch(core, gpu_resource)
        self.pods = pods
        self.gpu_resource = gpu_resource
        self.sync_seconds = sync_seconds
        self.overhead = resources_of(SIDECAR_REQUESTS, gpu_resource)
        self._told: str | None = None
        self._node_version = -1
        self._index = NodeIndex(())
        self._generation = -1
        # By training label: the (node, requests) of its bound pods that run, and how
        # many of its pods are placed (bound, or ended).
        self._held: dict[str, tuple[tuple[tuple[str, Resources], ...], int]] = {}
        self._used: dict[str, Resources] = {}
        self._free: dict[str, Resources] = {}
        self._gpu_free: set[str] = set()  # the nodes with a GPU free
        # Each pod's usage, parsed once per resourceVersion (by uid), and the uids of each
        # training label's pods (those of pods gone are dropped).
        self._usage: dict[str, tuple[str, tuple[str, Resources] | None]] = {}
        self._uids: dict[str, set[str]] = {}
        self._shapes: dict[str, Shape] = {}
        self._computes: Mapping[str, ComputeSpec] | None = None

    def close(self) -> None:
        self.nodes.close()

    def _tell(self, why: str) -> None:
        if self._told != why:
            self._told = why
            log.warning("admission counts DLAAS_K8S_SLOTS, not the cluster's nodes: %s", why)

    def fit(
        self, starting: Sequence[Candidate], computes: Mapping[str, ComputeSpec]
    ) -> ClusterFit | None:
        if not self.nodes.ensure_started(self.sync_seconds):
            self._tell(f"the nodes could not be listed in {self.sync_seconds:.0f} s")
            return None
        if self.nodes.version != self._node_version:
            self._node_version, nodes = self.nodes.snapshot()
            self._index = NodeIndex(nodes)
            self._free = {}
            self._gpu_free = set()
            for n in self._index.nodes:
                self._set_free(n.name)
        if not self._index.nodes:
            self._tell("the cluster reports no Ready node")
            return None
        self._told = None
        self.pods.ensure_started()
        generation, changed = self.pods.changed_since(self._generation)
        if changed is None:
            changed = self.pods.trainings() | set(self._held)
        for training in changed:
            self._update(training)
        self._generation = generation
        if computes is not self._computes:
            self._computes = computes
            self._shapes = {n: Shape.of(n, spec, self.overhead) for n, spec in computes.items()}
        shapes = self._shapes
        packing = Packing(self._index, self._used, self._free, self._gpu_free)
        packing.reserve(
            Demand(c.training_id, shapes[c.compute], missing)
            for c in starting
            if c.compute in shapes
            and (missing := c.nodes - self._placed(label_value(c.training_id))) > 0
        )
        return ClusterFit(packing, shapes)

    def _placed(self, training: str) -> int:
        held = self._held.get(training)
        return held[1] if held else 0

    def _set_free(self, node: str) -> None:
        allocatable = self._index.allocatable[node]
        used = self._used.get(node)
        free = self._free[node] = allocatable if used is None else allocatable - used
        if free.gpus > 0:
            self._gpu_free.add(node)
        else:
            self._gpu_free.discard(node)

    def _update(self, training: str) -> None:
        """Read the training's pods again: what they hold replaces what they held."""
        old, _ = self._held.pop(training, ((), 0))
        touched = {node for node, _ in old}
        for node, amount in old:
            self._used[node] = self._used[node] - amount
        usages: list[tuple[str, Resources]] = []
        placed = 0
        uids: set[str] = set()
        for name, pod in self.pods.pods(training).live.items():
            meta = pod.get("metadata") or {}
            uid = str(meta.get("uid") or name)
            uids.add(uid)
            version = str(meta.get("resourceVersion") or "")
            cached = self._usage.get(uid)
            if cached is None or cached[0] != version:
                cached = self._usage[uid] = (version, pod_usage(pod, self.gpu_resource))
            usage = cached[1]
            if usage is not None:
                usages.append(usage)
                self._used[usage[0]] = self._used.get(usage[0], Resources()) + usage[1]
                touched.add(usage[0])
            if usage is not None or (pod.get("status") or {}).get("phase") in _ENDED_PHASES:
                placed += 1
        for uid in self._uids.pop(training, set()) - uids:
            self._usage.pop(uid, None)
        if uids:
            self._uids[training] = uids
        if usages or placed:
            self._held[training] = (tuple(usages), placed)
        for node in touched:
            if node in self._index.allocatable:
                self._set_free(node)
