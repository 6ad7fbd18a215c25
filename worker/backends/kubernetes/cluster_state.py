"""The cluster's nodes, kept current by one watch (listed once, then watched from that
resourceVersion, listed again on 410 Gone), and the objects read as capacity's numbers:
a node's allocatable GPUs, CPU and memory, its labels, taints and cordon; a pod's
effective requests (Kubernetes' rule: the app containers and the sidecars together, or
the largest init container with the sidecars started before it, whichever is more).

Quantities ("100m", "24Gi") are parsed by the official client's parse_quantity.
"""

from __future__ import annotations

import contextlib
import json
import logging
import socket
import threading
from collections.abc import Mapping
from typing import Any

from kubernetes import client, watch
from kubernetes.client.rest import ApiException
from kubernetes.utils import parse_quantity

from worker.backends.kubernetes.capacity import Node, Resources, Taint

log = logging.getLogger(__name__)

WATCH_SECONDS = 60
RETRY_SECONDS = 1.0
# Seconds between tries when the nodes may not be read (no ClusterRole): said once.
FORBIDDEN_RETRY_SECONDS = 60.0
_ENDED_PHASES = ("Succeeded", "Failed")


def _amount(values: Mapping[str, Any], name: str, scale: int = 1) -> int:
    value = values.get(name)
    if value is None:
        return 0
    try:
        return int(parse_quantity(str(value)) * scale)
    except ValueError:
        return 0


def resources_of(values: Mapping[str, Any] | None, gpu_resource: str) -> Resources:
    """A resource list ({"cpu": "500m", "memory": "1Gi", "nvidia.com/gpu": "2"}) as numbers."""
    values = values or {}
    return Resources(
        _amount(values, gpu_resource), _amount(values, "cpu", 1000), _amount(values, "memory")
    )


def _container_requests(container: Mapping[str, Any], gpu_resource: str) -> Resources:
    resources = container.get("resources") or {}
    # A resource with a limit and no request requests its limit.
    merged = {**(resources.get("limits") or {}), **(resources.get("requests") or {})}
    return resources_of(merged, gpu_resource)


def _maximum(a: Resources, b: Resources) -> Resources:
    return Resources(max(a.gpus, b.gpus), max(a.cpu_milli, b.cpu_milli), max(a.memory, b.memory))


def pod_requests(spec: Mapping[str, Any], gpu_resource: str) -> Resources:
    """What the scheduler reserves for a pod of this spec."""
    sidecars = Resources()
    init_peak = Resources()
    for container in spec.get("initContainers") or []:
        own = _container_requests(container, gpu_resource)
        if container.get("restartPolicy") == "Always":  # a sidecar: runs beside the app
            sidecars = sidecars + own
            init_peak = _maximum(init_peak, sidecars)
        else:
            init_peak = _maximum(init_peak, sidecars + own)
    app = Resources()
    for container in spec.get("containers") or []:
        app = app + _container_requests(container, gpu_resource)
    return _maximum(app + sidecars, init_peak)


def pod_usage(pod: Mapping[str, Any], gpu_resource: str) -> tuple[str, Resources] | None:
    """The node a pod is bound to and what it holds there; None for a pod on no node yet,
    or one that ended (its containers hold nothing)."""
    spec = pod.get("spec") or {}
    node = spec.get("nodeName")
    if not node or (pod.get("status") or {}).get("phase") in _ENDED_PHASES:
        return None
    return str(node), pod_requests(spec, gpu_resource)


def node_of(obj: Mapping[str, Any], gpu_resource: str) -> Node | None:
    """A Node object as capacity reads it; None for one that is not Ready."""
    meta = obj.get("metadata") or {}
    spec = obj.get("spec") or {}
    status = obj.get("status") or {}
    conditions = status.get("conditions") or []
    if any(c.get("type") == "Ready" and c.get("status") != "True" for c in conditions):
        return None
    taints = tuple(
        Taint(str(t.get("key", "")), str(t.get("value") or ""), str(t.get("effect", "")))
        for t in spec.get("taints") or []
    )
    return Node(
        name=str(meta.get("name", "")),
        allocatable=resources_of(status.get("allocatable"), gpu_resource),
        labels=dict(meta.get("labels") or {}),
        taints=taints,
        unschedulable=bool(spec.get("unschedulable")),
    )


class NodeWatch:
    """The cluster's nodes, listed then watched from a background thread; each kept as
    capacity reads it (parsed once, when it changes; None: not Ready)."""

    def __init__(self, core: client.CoreV1Api, gpu_resource: str) -> None:
        self.core = core
        self.gpu_resource = gpu_resource
        self._lock = threading.Lock()
        self._nodes: dict[str, Node | None] = {}
        self._resource_version: str | None = None
        self._synced = threading.Event()
        self._stopping = threading.Event()
        self._thread: threading.Thread | None = None
        self._watcher: watch.Watch | None = None
        # Counted for the benchmarks and tests: lists made.
        self.lists = 0
        # Raised by every change: what readers keep derived data by.
        self._version = 0
        self._forbidden = False

    def ensure_started(self, timeout: float) -> bool:
        """Start the watch (once); whether its first list is in the cache within `timeout`."""
        with self._lock:
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name="k8s-nodes", daemon=True)
                self._thread.start()
        return self._synced.wait(timeout)

    def nodes(self) -> list[Node]:
        """The Ready nodes."""
        return self.snapshot()[1]

    @property
    def version(self) -> int:
        return self._version

    def snapshot(self) -> tuple[int, list[Node]]:
        """The version of the cache and its Ready nodes, together."""
        with self._lock:
            return self._version, [n for n in self._nodes.values() if n is not None]

    def close(self, timeout: float = 5.0) -> None:
        self._stopping.set()
        watcher, thread = self._watcher, self._thread
        if watcher is not None:
            watcher.stop()
            response = getattr(watcher, "_resp", None)
            sock = getattr(getattr(response, "connection", None), "sock", None)
            if sock is not None:
                with contextlib.suppress(OSError):
                    sock.shutdown(socket.SHUT_RDWR)
        if thread is not None:
            thread.join(timeout)

    def _run(self) -> None:
        while not self._stopping.is_set():
            try:
                if self._resource_version is None:
                    self._relist()
                self._stream()
            except ApiException as e:
                if self._stopping.is_set():
                    return
                if e.status == 410:
                    self._resource_version = None
                    continue
                if e.status in (401, 403):
                    if not self._forbidden:
                        self._forbidden = True
                        log.warning(
                            "the nodes may not be listed (%s): admission counts "
                            "DLAAS_K8S_SLOTS; grant get, list, watch on nodes",
                            e.status,
                        )
                    self._stopping.wait(FORBIDDEN_RETRY_SECONDS)
                    continue
                log.warning("node watch failed (%s); retrying", e.status)
                self._stopping.wait(RETRY_SECONDS)
            except Exception as e:
                if self._stopping.is_set():
                    return
                log.warning("node watch failed (%s); retrying", e)
                self._stopping.wait(RETRY_SECONDS)

    def _relist(self) -> None:
        listed = json.loads(self.core.list_node(_preload_content=False).data)
        self.lists += 1
        nodes = {
            item["metadata"]["name"]: node_of(item, self.gpu_resource)
            for item in listed.get("items") or []
            if isinstance(item, dict) and item.get("metadata", {}).get("name")
        }
        with self._lock:
            self._nodes = nodes
            self._version += 1
            self._resource_version = str(listed.get("metadata", {}).get("resourceVersion") or "")
        self._synced.set()

    def _stream(self) -> None:
        self._watcher = watch.Watch()
        stream = self._watcher.stream(
            self.core.list_node,
            resource_version=self._resource_version,
            allow_watch_bookmarks=True,
            timeout_seconds=WATCH_SECONDS,
        )
        for event in stream:
            if self._stopping.is_set():
                return
            kind, raw = event.get("type"), event.get("raw_object")
            if not isinstance(raw, dict):
                continue
            if kind == "ERROR":
                code = raw.get("code")
                raise ApiException(status=code if isinstance(code, int) else 500)
            meta = raw.get("metadata") or {}
            if isinstance(meta.get("resourceVersion"), str) and meta["resourceVersion"]:
                self._resource_version = meta["resourceVersion"]
            name = meta.get("name")
            if not isinstance(name, str):
                continue
            with self._lock:
                if kind == "DELETED":
                    self._nodes.pop(name, None)
                elif kind in ("ADDED", "MODIFIED"):
                    self._nodes[name] = node_of(raw, self.gpu_resource)
                self._version += 1
