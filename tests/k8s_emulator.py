"""A Kubernetes API server for tests: kmock's KubernetesEmulator, run in its own thread,
reached through the official `kubernetes` client by a kubeconfig file.

No cluster can run here, so the API is emulated (the one place a double is allowed, and
kmock is a maintained one). kmock's emulator stores objects and streams watches, but it
leaves out what a watch-driven control loop depends on; `Apiserver` adds exactly that,
through the extension points kmock documents (inherit, override the serving methods):

- the official client asks for a watch with `watch=True`, which kmock (expecting `true`)
  serves as a plain list: such requests are served as watches;
- objects get what the API server sets on create: `metadata.namespace`, `uid`,
  `creationTimestamp`, and a pod's `status.phase: Pending`;
- every create, update (status included) and delete gets a new `resourceVersion` from
  one counter; a list carries the current one;
- lists and watches honour `labelSelector` (equality, set-based and existence forms);
- a watch from a `resourceVersion` streams every change after it, from a bounded event
  history; one older than the history (see `compact`) gets the API server's answer, an
  ERROR event with a `410` Status (reason Expired); `timeoutSeconds` ends the stream;
- deleting an object deletes what names it in `ownerReferences` (the garbage collector's
  background propagation; `propagationPolicy: Orphan` leaves them), and DELETE on a
  collection (`delete_collection_namespaced_*`, by labelSelector) works.

- NetworkPolicies (networking.k8s.io/v1, which kmock stores as any resource) are
  validated on create against Kubernetes 1.30's schema, strictly (kubernetes-validate):
  an invalid one is refused with the API server's 422 Invalid, and not stored.

- a pod on a node (`spec.nodeName` set) is deleted gracefully: `deletionTimestamp` first,
  its status still patchable, gone when the kubelet (the test) deletes it with
  `grace_period_seconds=0`.

- with nodes (`create_node`: allocatable resources, labels, taints), a scheduler
  (tests/k8s_scheduler.py) binds each pod on no node to the first node it fits
  (`spec.nodeName`, `PodScheduled=True`) after every change to pods or nodes, and marks
  one that fits none `PodScheduled=False`, reason `Unschedulable`. Without nodes nothing
  is scheduled (the tests play the kubelet on unbound pods).

Custom resources (scheduler-plugins' `PodGroup`, through the client's CustomObjectsApi)
are stored, listed by label and garbage-collected as any other object: kmock serves any
group and plural without a CRD.

Any other deletion is immediate (kmock keeps a `deletionTimestamp` only for objects with
finalizers). Updates are merge patches; PUT (`replace_*`) is not served.

Tests play the kubelet through the same client (`patch_namespaced_pod_status`); kmock
merges patches as JSON merge patches (dicts merged, lists replaced), so a status patch
sends whole `containerStatuses` lists, as a kubelet does.
"""

from __future__ import annotations

import asyncio
import itertools
import re
import threading
import time
import uuid
from collections import deque
from collections.abc import AsyncIterator, Callable, Coroutine, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any, TypeVar

import aiohttp.web
import attrs
import kmock
import kubernetes_validate
import yaml
from kmock._internal import rendering  # the Request type the serving methods receive

from tests.k8s_scheduler import Scheduler

T = TypeVar("T")

Selector = Callable[[Mapping[str, str]], bool]

_SET_FORM = re.compile(r"^\s*([^\s!=]+)\s+(in|notin)\s+\(([^)]*)\)\s*$")


def parse_label_selector(text: str) -> Selector:
    """A `labelSelector` query parameter as a predicate over an object's labels: `k=v`,
    `k==v`, `k!=v`, `k in (a,b)`, `k notin (a,b)`, `k`, `!k`, comma-separated (ANDed)."""
    requirements: list[Selector] = []
    for part in _split_requirements(text):
        requirements.append(_requirement(part))
    return lambda labels: all(req(labels) for req in requirements)


def _split_requirements(text: str) -> list[str]:
    parts, depth, current = [], 0, ""
    for char in text:
        depth += {"(": 1, ")": -1}.get(char, 0)
        if char == "," and depth == 0:
            parts.append(current)
            current = ""
        else:
            current += char
    parts.append(current)
    return [part.strip() for part in parts if part.strip()]


def _requirement(part: str) -> Selector:
    set_form = _SET_FORM.match(part)
    if set_form:
        key, op, values = set_form.groups()
        allowed = {v.strip() for v in values.split(",") if v.strip()}
        if op == "in":
            return lambda labels: labels.get(key) in allowed
        return lambda labels: labels.get(key) not in allowed
    for op in ("!=", "==", "="):
        if op in part:
            key, value = (s.strip() for s in part.split(op, 1))
            if op == "!=":
                return lambda labels: labels.get(key) != value
            return lambda labels: labels.get(key) == value
    if part.startswith("!"):
        key = part[1:].strip()
        return lambda labels: key not in labels
    return lambda labels: part in labels


def gone(requested: int, oldest: int) -> dict[str, Any]:
    """The API server's answer to a watch from a resourceVersion it no longer has."""
    return {
        "type": "ERROR",
        "object": {
            "kind": "Status",
            "apiVersion": "v1",
            "metadata": {},
            "status": "Failure",
            "message": f"too old resource version: {requested} ({oldest})",
            "reason": "Expired",
            "code": 410,
        },
    }


@dataclass(frozen=True)
class _Event:
    resource_version: int
    resource: kmock.resource
    namespace: str | None
    type: str
    object: dict[str, Any]


@attrs.define(kw_only=True)
class Apiserver(kmock.KubernetesEmulator):
    """kmock's emulator with resourceVersions, label selectors and resumable watches."""

    # How many events a watch can resume from; older ones answer 410 Gone.
    history_limit: int = 1000

    # Versions start above 1: a list never reports "0", which a watch reads as "any".
    _counter: Iterator[int] = attrs.field(factory=lambda: itertools.count(2), init=False)
    _current_rv: int = attrs.field(default=1, init=False)
    # The newest change in the history: what a list reports, where a watch of it resumes.
    _recorded_rv: int = attrs.field(default=1, init=False)
    # One change at a time, stamped, applied and recorded, so versions reach the history
    # in order.
    _mutating: asyncio.Lock = attrs.field(factory=asyncio.Lock, init=False)
    _events: deque[_Event] = attrs.field(factory=deque, init=False)
    # Watches may resume from any resourceVersion >= this one.
    _oldest_rv: int = attrs.field(default=1, init=False)
    _changed: asyncio.Condition = attrs.field(factory=asyncio.Condition, init=False)
    # What `GET pods/<name>/log?container=<c>` answers (kmock serves no pods/log): the text
    # a test sets as a container's log, by (namespace, pod, container).
    pod_logs: dict[tuple[str, str, str], str] = attrs.field(factory=dict, init=False)
    # Binds pods to nodes (tests/k8s_scheduler.py).
    scheduler: Scheduler = attrs.field(factory=Scheduler, init=False)

    def _next_rv(self) -> str:
        self._current_rv = next(self._counter)
        return str(self._current_rv)

    async def _handle(self, request: rendering.Request) -> Any:
        watching = _as_watch(request)
        if watching is not request:
            # kmock routes a request by its identity among those it recorded: record this one.
            self._requests[:] = [watching if r is request else r for r in self._requests]
            request = watching
        if request.resource is None:
            return await super()._handle(request)
        if _is_pods(request.resource) and request.subresource == "log":
            return self._serve_pod_log(request)
        refusal = _invalid_network_policy(request)
        if refusal is not None:
            return refusal
        if request.method == kmock.method.DELETE and request.name is None:
            async with self._mutating:
                deleted_all = await self._delete_collection(request)
                await self._schedule()
                return deleted_all
        if _is_pods(request.resource) and request.name is not None:
            async with self._mutating:
                if request.method == kmock.method.DELETE:
                    answer = await self._delete_bound_pod(request)
                elif request.action == kmock.action.UPDATE:
                    answer = await self._update_terminating_pod(request)
                else:
                    answer = None
                if answer is not None:
                    await self._schedule()
            if answer is not None:
                return answer
        changes = request.action in (kmock.action.CREATE, kmock.action.UPDATE, kmock.action.DELETE)
        if not changes:
            return await super()._handle(request)
        async with self._mutating:
            key, rv = await self._stamp(request)
            try:
                served = await super()._handle(request)
            finally:
                if key is not None and rv is not None:
                    deleted = await self._record(key, request.action, rv)
                    if deleted is not None and not _orphans(request):
                        await self._collect_garbage(deleted)
            if _is_pods(request.resource) or _is_nodes(request.resource):
                await self._schedule()
            return served

    async def _schedule(self) -> None:
        """Run the scheduler (tests/k8s_scheduler.py) on the nodes and pods now."""
        async with self._lock:
            nodes = sorted(
                (obj.last.raw for key, obj in self.objects.items()
                 if _is_nodes(key[0]) and not obj.deleted),
                key=lambda n: n["metadata"]["name"],
            )  # fmt: skip
            pods = [
                (key, obj.last.raw)
                for key, obj in self.objects.items()
                if _is_pods(key[0]) and not obj.deleted
            ]
        for key, patch in self.scheduler.decide(nodes, pods):
            async with self._lock:
                if key not in self.objects or self.objects[key].deleted:
                    continue
                rv = self._next_rv()
                patch["metadata"] = {"resourceVersion": rv}
                self.objects[key].patch(patch)
            await self._record(key, kmock.action.UPDATE, rv)

    def _serve_pod_log(self, request: rendering.Request) -> aiohttp.web.Response:
        """A container's log as a kubelet serves it through the API: text/plain, cut at
        limitBytes; 404 for a pod or container it has none of (it never ran)."""
        key = (request.namespace or "", request.name or "", request.params.get("container", ""))
        if request.method != kmock.method.GET or key not in self.pod_logs:
            return aiohttp.web.json_response({"kind": "Status", "code": 404}, status=404)
        data = self.pod_logs[key].encode()
        if (limit := request.params.get("limitBytes", "")).isdigit():
            data = data[: int(limit)]
        return aiohttp.web.Response(body=data, content_type="text/plain")

    async def _delete_collection(self, request: rendering.Request) -> aiohttp.web.Response:
        """DELETE on a collection (`delete_collection_namespaced_pod`), which kmock lacks:
        every object of the resource in the namespace that the labelSelector matches."""
        matches = _selector(request)
        async with self._lock:
            keys = [
                key
                for key, obj in self.objects.items()
                if key[0] == request.resource
                and not obj.deleted
                and (request.namespace is None or key[1] == request.namespace)
                and matches(obj.last.raw)
            ]
        for key in keys:
            uid = await self._delete(key)
            if uid is not None and not _orphans(request):
                await self._collect_garbage(uid)
        return aiohttp.web.json_response(
            {"apiVersion": "v1", "kind": "Status", "metadata": {}, "status": "Success"}
        )

    async def _delete_bound_pod(self, request: rendering.Request) -> aiohttp.web.Response | None:
        """A pod on a node is deleted gracefully, as the API server does: the first DELETE
        sets `deletionTimestamp` (now + the grace period) and `deletionGracePeriodSeconds`
        (a MODIFIED event); the pod goes (DELETED) when the kubelet, played by the test,
        deletes it with `grace_period_seconds=0`. None: not such a pod (kmock serves it)."""
        key = (request.resource, request.namespace, request.name)
        async with self._lock:
            if key not in self.objects or self.objects[key].deleted:
                return None
            raw = self.objects[key].last.raw
        if not raw.get("spec", {}).get("nodeName"):
            return None  # never scheduled: no kubelet to wait for, deleted at once
        grace = _grace_period(request, raw)
        if grace == 0:
            uid = await self._delete(key)
            if uid is not None and not _orphans(request):
                await self._collect_garbage(uid)
            async with self._lock:
                return aiohttp.web.json_response(self.objects[key].last.raw)
        if not raw.get("metadata", {}).get("deletionTimestamp"):
            async with self._lock:
                rv = self._next_rv()
                deadline = datetime.now(UTC) + timedelta(seconds=grace)
                meta = {
                    "deletionTimestamp": deadline.strftime("%Y-%m-%dT%H:%M:%SZ"),
                    "deletionGracePeriodSeconds": grace,
                    "resourceVersion": rv,
                }
                self.objects[key].patch({"metadata": meta})
            await self._record(key, kmock.action.UPDATE, rv)
        async with self._lock:
            return aiohttp.web.json_response(self.objects[key].last.raw)

    async def _update_terminating_pod(
        self, request: rendering.Request
    ) -> aiohttp.web.Response | None:
        """A terminating pod's status changes as its containers stop (kmock would delete an
        object with a deletionTimestamp and no finalizers on any update). None: not such a
        pod (kmock serves it)."""
        key = (request.resource, request.namespace, request.name)
        if not isinstance(request.data, dict):
            return None
        async with self._lock:
            if key not in self.objects or self.objects[key].deleted:
                return None
            if not self.objects[key].last.raw.get("metadata", {}).get("deletionTimestamp"):
                return None
            rv = self._next_rv()
            request.data.setdefault("metadata", {})["resourceVersion"] = rv
            self.objects[key].patch(request.data)
        await self._record(key, kmock.action.UPDATE, rv)
        async with self._lock:
            return aiohttp.web.json_response(self.objects[key].last.raw)

    async def _delete(self, key: Any) -> str | None:
        """Delete one object at once (no finalizers, no grace period); its uid."""
        async with self._lock:
            if key not in self.objects or self.objects[key].deleted:
                return None
            rv = self._next_rv()
            self.objects[key].patch({"metadata": {"resourceVersion": rv}})
            self.objects[key].delete()
        return await self._record(key, kmock.action.DELETE, rv)

    async def _collect_garbage(self, owner_uid: str) -> None:
        """What the garbage collector does after an owner is deleted (background
        propagation): delete every object whose ownerReferences name it, and theirs."""
        async with self._lock:
            dependents = [
                key
                for key, obj in self.objects.items()
                if not obj.deleted
                and any(
                    ref.get("uid") == owner_uid
                    for ref in obj.last.raw.get("metadata", {}).get("ownerReferences") or []
                )
            ]
        for key in dependents:
            uid = await self._delete(key)
            if uid is not None:
                await self._collect_garbage(uid)

    async def _stamp(self, request: rendering.Request) -> tuple[Any, str | None]:
        """Set what the API server sets on a change, before kmock applies it."""
        action = request.action
        if action == kmock.action.CREATE and isinstance(request.data, dict):
            meta = request.data.setdefault("metadata", {})
            namespace = request.namespace or meta.get("namespace")
            if namespace is not None:
                meta["namespace"] = namespace
            meta.setdefault("uid", str(uuid.uuid4()))
            meta.setdefault("creationTimestamp", _now())
            meta["resourceVersion"] = rv = self._next_rv()
            if _is_pods(request.resource):
                request.data.setdefault("status", {}).setdefault("phase", "Pending")
            return (request.resource, namespace, meta.get("name")), rv
        if request.name is None:
            return None, None
        key = (request.resource, request.namespace, request.name)
        if action == kmock.action.UPDATE and isinstance(request.data, dict):
            rv = self._next_rv()
            request.data.setdefault("metadata", {})["resourceVersion"] = rv
            return key, rv
        if action == kmock.action.DELETE:
            async with self._lock:
                if key not in self.objects or self.objects[key].deleted:
                    return None, None
                rv = self._next_rv()
                self.objects[key].patch({"metadata": {"resourceVersion": rv}})
            return key, rv
        return None, None

    async def _record(self, key: Any, action: kmock.action | None, rv: str) -> str | None:
        """Keep the event a change made, if it was made (kmock may have refused it); the
        object's uid if the change deleted it."""
        async with self._lock:
            if key not in self.objects:
                return None
            obj = self.objects[key]
            raw = obj.last.raw
            if raw.get("metadata", {}).get("resourceVersion") != rv:
                return None
            if obj.deleted:
                kind = "DELETED"
            else:
                kind = "ADDED" if action == kmock.action.CREATE else "MODIFIED"
        event = _Event(int(rv), key[0], key[1], kind, raw)
        async with self._changed:
            self._events.append(event)
            self._recorded_rv = event.resource_version
            while len(self._events) > self.history_limit:
                self._oldest_rv = self._events.popleft().resource_version
            self._changed.notify_all()
        return raw.get("metadata", {}).get("uid") if kind == "DELETED" else None

    async def compact(self) -> None:
        """Forget the event history, as etcd's compaction does: a watch from any earlier
        resourceVersion then gets 410 Gone."""
        async with self._changed:
            self._events.clear()
            self._oldest_rv = self._recorded_rv

    async def _serve_list(self, request: rendering.Request) -> rendering.Payload:
        matches = _selector(request)
        async with self._lock:
            items = [
                obj.last.raw
                for (resource, namespace, _), obj in self.objects.items()
                if resource == request.resource
                and not obj.deleted
                and (request.namespace is None or namespace == request.namespace)
                and matches(obj.last.raw)
            ]
            rv = str(self._recorded_rv)
        return {
            "apiVersion": "v1",
            "kind": "List",
            "metadata": {"resourceVersion": rv},
            "items": items,
        }

    async def _serve_watch(self, request: rendering.Request) -> AsyncIterator[rendering.Payload]:
        yield b""  # send the headers now: a watch may see nothing for a while
        matches = _selector(request)
        params = request.params
        deadline = None
        if params.get("timeoutSeconds"):
            deadline = time.monotonic() + float(params["timeoutSeconds"])
        requested = params.get("resourceVersion", "")

        def wanted(event: _Event) -> bool:
            return (
                event.resource == request.resource
                and (request.namespace is None or event.namespace == request.namespace)
                and (request.name is None or event.object["metadata"].get("name") == request.name)
                and matches(event.object)
            )

        async with self._changed:
            if requested in ("", "0"):
                # No version: the current objects as ADDED, then what changes after.
                listed = await self._serve_list(request)
                assert isinstance(listed, dict)
                for item in listed["items"]:
                    yield {"type": "ADDED", "object": item}
                since = int(listed["metadata"]["resourceVersion"])
            else:
                since = int(requested)
                if since < self._oldest_rv:
                    yield gone(since, self._oldest_rv)
                    return
        while True:
            async with self._changed:
                pending = [e for e in self._events if e.resource_version > since]
                if not pending:
                    timeout = None if deadline is None else deadline - time.monotonic()
                    if timeout is not None and timeout <= 0:
                        return
                    try:
                        await asyncio.wait_for(self._changed.wait(), timeout)
                    except TimeoutError:
                        return
                    continue
            for event in pending:
                since = event.resource_version
                if wanted(event):
                    yield {"type": event.type, "object": event.object}


def _as_watch(request: rendering.Request) -> rendering.Request:
    """The official client sends `watch=True`; kmock recognises `watch=true` only."""
    asks = request.params.get("watch", "").lower() in ("true", "1")
    if asks and request.action != kmock.action.WATCH and request.method == kmock.method.GET:
        return attrs.evolve(request, action=kmock.action.WATCH)
    return request


def _is_pods(resource: kmock.resource | None) -> bool:
    return resource is not None and resource.group == "" and resource.plural == "pods"


# The version whose schemas the emulator validates the objects it checks against.
VALIDATED_VERSION = "1.30.0"


def _invalid_network_policy(request: rendering.Request) -> aiohttp.web.Response | None:
    """The API server's 422 for a NetworkPolicy create that its schema refuses."""
    resource = request.resource
    if (
        resource is None
        or resource.group != "networking.k8s.io"
        or resource.plural != "networkpolicies"
        or request.action != kmock.action.CREATE
    ):
        return None
    try:
        kubernetes_validate.validate(request.data, VALIDATED_VERSION, strict=True)
    except kubernetes_validate.ValidationError as e:
        path = ".".join(str(p) for p in e.path)
        status = {
            "kind": "Status",
            "apiVersion": "v1",
            "metadata": {},
            "status": "Failure",
            "message": f"NetworkPolicy is invalid: {path}: {e.message}",
            "reason": "Invalid",
            "code": 422,
        }
        return aiohttp.web.json_response(status, status=422)
    return None


def _is_nodes(resource: kmock.resource | None) -> bool:
    return resource is not None and resource.group == "" and resource.plural == "nodes"


def _grace_period(request: rendering.Request, pod: Mapping[str, Any]) -> int:
    """The grace a pod's DELETE asks for: the request's, else the pod's own (default 30)."""
    body = request.data if isinstance(request.data, dict) else {}
    asked = request.params.get("gracePeriodSeconds", body.get("gracePeriodSeconds"))
    if asked is None:
        asked = pod.get("spec", {}).get("terminationGracePeriodSeconds", 30)
    return int(asked)


def _orphans(request: rendering.Request) -> bool:
    """Whether a delete asks to leave the object's dependents (propagationPolicy=Orphan)."""
    body = request.data if isinstance(request.data, dict) else {}
    policy = request.params.get("propagationPolicy") or body.get("propagationPolicy")
    return policy == "Orphan" or body.get("orphanDependents") is True


def _selector(request: rendering.Request) -> Callable[[Mapping[str, Any]], bool]:
    selector = parse_label_selector(request.params.get("labelSelector", ""))
    return lambda obj: selector(obj.get("metadata", {}).get("labels") or {})


def _now() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


@dataclass
class RunningApiserver:
    """An `Apiserver` serving on localhost from its own thread and event loop."""

    emulator: Apiserver
    url: str
    kubeconfig: Path
    loop: asyncio.AbstractEventLoop

    def call(self, coro: Coroutine[Any, Any, T], timeout: float = 10) -> T:
        """Run a coroutine on the emulator's loop (its objects belong to that loop)."""
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(timeout)

    def compact(self) -> None:
        self.call(self.emulator.compact())


@contextmanager
def running_apiserver(directory: Path, *, history_limit: int = 1000) -> Iterator[RunningApiserver]:
    """Start an `Apiserver`, write a kubeconfig for it under `directory`, yield; stop it."""
    ready = threading.Event()
    found: dict[str, Any] = {}

    async def serve() -> None:
        stop = asyncio.Event()
        async with (
            Apiserver(history_limit=history_limit) as emulator,
            kmock.Server(emulator) as server,
        ):
            found.update(emulator=emulator, url=str(server.url).rstrip("/"), stop=stop)
            found["loop"] = asyncio.get_running_loop()
            ready.set()
            await stop.wait()

    def run() -> None:
        try:
            asyncio.run(serve())
        except BaseException as exc:  # surfaced to the test below
            found["error"] = exc
            ready.set()

    thread = threading.Thread(target=run, name="k8s-apiserver", daemon=True)
    thread.start()
    if not ready.wait(30) or "error" in found:
        raise RuntimeError(f"the Kubernetes API emulator did not start: {found.get('error')}")
    kubeconfig = directory / "kubeconfig"
    kubeconfig.write_text(yaml.safe_dump(_kubeconfig(found["url"])))
    try:
        yield RunningApiserver(found["emulator"], found["url"], kubeconfig, found["loop"])
    finally:
        found["loop"].call_soon_threadsafe(found["stop"].set)
        thread.join(30)


def _kubeconfig(url: str) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{"name": "emulator", "cluster": {"server": url}}],
        "users": [{"name": "tests", "user": {"token": "emulator"}}],
        "contexts": [
            {
                "name": "emulator",
                "context": {"cluster": "emulator", "user": "tests", "namespace": "dlaas"},
            }
        ],
        "current-context": "emulator",
    }
