"""The pods of every training in one namespace, kept current by one watch (not by polling
every pod): what the backend observes from, with no API call per observation.

A background thread lists the pods with the training label once (the cache and its
resourceVersion), then watches from that resourceVersion, resuming from the last one it saw
each time a stream ends; when the API server no longer has that version (410 Gone, as an
ApiException or an ERROR event) it lists again. Every change wakes the callbacks the
monitor registered, so it need not poll fast to notice.

A pod that disappears (a DELETED event, or missing from a relist) is remembered with its
last state until its training is forgotten (cleaned up): its learner is LOST, not missing.
Pods of a forgotten training are ignored by uid from then on, so the late events of a
cleanup never bring a training back.
"""

from __future__ import annotations

import contextlib
import json
import logging
import socket
import threading
import time
from collections import deque
from collections.abc import Callable, Collection, Mapping
from typing import Any

from kubernetes import client, watch
from kubernetes.client.rest import ApiException

from worker.backends.kubernetes.objects import TRAINING_LABEL
from worker.backends.kubernetes.observation import Pod, TrainingPods

log = logging.getLogger(__name__)

# Seconds one watch request lasts before it is resumed (the API server's limit is longer).
WATCH_SECONDS = 60
# Seconds between two attempts when the API cannot be reached.
RETRY_SECONDS = 1.0
# Uids of forgotten pods kept to ignore their late events.
_FORGOTTEN_MAX = 100_000


def _meta(pod: Mapping[str, Any]) -> Mapping[str, Any]:
    meta = pod.get("metadata")
    return meta if isinstance(meta, Mapping) else {}


def training_of(pod: Mapping[str, Any]) -> str | None:
    """The training label of `pod` (label_value of its training id), or None."""
    labels = _meta(pod).get("labels")
    value = labels.get(TRAINING_LABEL) if isinstance(labels, Mapping) else None
    return value if isinstance(value, str) else None


class PodWatch:
    """The namespace's training pods, listed then watched from a background thread."""

    def __init__(self, core: client.CoreV1Api, namespace: str) -> None:
        self.core = core
        self.namespace = namespace
        self._lock = threading.Condition()
        self._live: dict[str, dict[str, Pod]] = {}
        self._gone: dict[str, dict[str, Pod]] = {}
        self._forgotten: set[str] = set()
        self._forgotten_order: deque[str] = deque()
        self._resource_version: str | None = None
        self._wakes: list[Callable[[], None]] = []
        # The training labels whose pods changed since the last drain_changes(); None: all
        # of them may have (nothing drained yet, or a list replaced the cache).
        self._changed: set[str] | None = None
        self._synced = threading.Event()
        self._stopping = threading.Event()
        self._thread: threading.Thread | None = None
        self._watcher: watch.Watch | None = None
        # Counted for the benchmarks and tests: lists made (the first one and relists).
        self.lists = 0
        # For readers that follow the cache by generations (capacity: changed_since): a
        # counter raised by every change, the last one of each training label, the last list.
        self._generation = 0
        self._changed_at: dict[str, int] = {}
        self._listed_at = 0

    # -- lifecycle -------------------------------------------------------------------------

    def ensure_started(self, timeout: float = 30.0) -> None:
        """Start the watch (once) and wait until the first list is in the cache."""
        with self._lock:
            if self._thread is None:
                self._thread = threading.Thread(
                    target=self._run, name=f"k8s-pods-{self.namespace}", daemon=True
                )
                self._thread.start()
        if not self._synced.wait(timeout):
            raise RuntimeError(
                f"the pods of namespace {self.namespace} could not be listed in {timeout:.0f} s"
            )

    def running(self) -> bool:
        """Whether the watch was started and its first list is in the cache."""
        return self._synced.is_set()

    def close(self, timeout: float = 5.0) -> None:
        """Stop watching: the current request is cut short and the thread waited for."""
        self._stopping.set()
        thread = self._thread
        deadline = time.monotonic() + timeout
        while thread is not None and thread.is_alive() and time.monotonic() < deadline:
            self._cut_stream()
            thread.join(0.05)

    def _cut_stream(self) -> None:
        """End the watch's connection: its stream blocks reading until the next event. (The
        client keeps the response of a stream as `Watch._resp`.)"""
        watcher = self._watcher
        if watcher is None:
            return
        watcher.stop()
        response = getattr(watcher, "_resp", None)
        sock = getattr(getattr(response, "connection", None), "sock", None)
        if sock is not None:
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)

    # -- what the backend reads -------------------------------------------------------------

    def pods(self, training: str) -> TrainingPods:
        """A copy of what the cache holds of training label `training`."""
        with self._lock:
            return TrainingPods(
                dict(self._live.get(training, {})), dict(self._gone.get(training, {}))
            )

    def trainings(self) -> set[str]:
        """The training labels the cache holds pods (live or gone) of."""
        with self._lock:
            return set(self._live) | set(self._gone)

    def put(self, pod: Pod) -> None:
        """Add a pod this process just created (its create response), so that it is
        observed before the watch reports it; a newer state the watch already has wins."""
        training, name, uid = training_of(pod), _meta(pod).get("name"), _meta(pod).get("uid")
        if training is None or not isinstance(name, str):
            return
        with self._lock:
            if uid in self._forgotten:
                return
            live = self._live.setdefault(training, {})
            if _meta(live.get(name, {})).get("uid") != uid:
                live[name] = pod
                self._gone.get(training, {}).pop(name, None)
                self._mark(training)
            self._lock.notify_all()

    def wait_gone(
        self, training: str, timeout: float, names: Collection[str] | None = None
    ) -> bool:
        """Wait until no pod of `training` (of those named `names`, if given) is live;
        whether none is."""
        deadline = time.monotonic() + timeout

        def left() -> bool:
            live = self._live.get(training, {})
            return any(n in live for n in names) if names is not None else bool(live)

        with self._lock:
            while left():
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    return False
                self._lock.wait(remaining)
            return True

    def forget(self, training: str) -> None:
        """Drop the training's pods, and ignore their events from now on."""
        with self._lock:
            for pods in (self._live.pop(training, {}), self._gone.pop(training, {})):
                for pod in pods.values():
                    uid = _meta(pod).get("uid")
                    if isinstance(uid, str) and uid not in self._forgotten:
                        self._forgotten.add(uid)
                        self._forgotten_order.append(uid)
            while len(self._forgotten_order) > _FORGOTTEN_MAX:
                self._forgotten.discard(self._forgotten_order.popleft())
            self._mark(training)
            self._lock.notify_all()

    def drain_changes(self) -> set[str] | None:
        """The training labels whose pods were added, changed or deleted since the last
        call, and forget them; None when any may have (before the first call, and after a
        list, which may have replaced everything the watch missed)."""
        with self._lock:
            changed, self._changed = self._changed, set()
            return changed

    def _mark(self, training: str) -> None:
        """(Under the lock.) The training's pods changed."""
        self._generation += 1
        self._changed_at[training] = self._generation
        if self._changed is not None:
            self._changed.add(training)

    def changed_since(self, generation: int) -> tuple[int, set[str] | None]:
        """The current generation, and the training labels whose pods changed after
        `generation` (one this method returned); None: any may have (a list since)."""
        with self._lock:
            if generation < self._listed_at:
                return self._generation, None
            changed = {t for t, g in self._changed_at.items() if g > generation}
            for training in changed:
                if training not in self._live and training not in self._gone:
                    del self._changed_at[training]  # forgotten: read once more, then dropped
            return self._generation, changed

    def subscribe(self, wake: Callable[[], None]) -> Callable[[], None]:
        """Call `wake` after every change; returns what unsubscribes it."""
        with self._lock:
            self._wakes.append(wake)

        def unsubscribe() -> None:
            with self._lock:
                if wake in self._wakes:
                    self._wakes.remove(wake)

        return unsubscribe

    # -- the watch ---------------------------------------------------------------------------

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
                    log.info("pod watch of %s expired; listing again", self.namespace)
                    self._resource_version = None
                    continue
                log.warning("pod watch of %s failed (%s); retrying", self.namespace, e.status)
                self._stopping.wait(RETRY_SECONDS)
            except Exception as e:  # the API server unreachable, a reset stream
                if self._stopping.is_set():
                    return
                log.warning("pod watch of %s failed (%s); retrying", self.namespace, e)
                self._stopping.wait(RETRY_SECONDS)

    def _relist(self) -> None:
        response = self.core.list_namespaced_pod(
            self.namespace, label_selector=TRAINING_LABEL, _preload_content=False
        )
        listed = json.loads(response.data)
        self.lists += 1
        fresh: dict[str, dict[str, Pod]] = {}
        for pod in listed.get("items") or []:
            training, name = training_of(pod), _meta(pod).get("name")
            if training is None or not isinstance(name, str):
                continue
            if _meta(pod).get("uid") in self._forgotten:
                continue
            fresh.setdefault(training, {})[name] = pod
        with self._lock:
            # Pods the last list or watch had that are gone now: deleted while unwatched.
            for training, pods in self._live.items():
                for name, pod in pods.items():
                    if name not in fresh.get(training, {}):
                        self._gone.setdefault(training, {})[name] = pod
            for training, pods in fresh.items():
                for name in pods:
                    self._gone.get(training, {}).pop(name, None)
            self._gone = {t: pods for t, pods in self._gone.items() if pods}
            self._live = fresh
            self._changed = None
            self._generation += 1
            self._listed_at = self._generation
            self._resource_version = str(listed.get("metadata", {}).get("resourceVersion") or "")
            self._lock.notify_all()
        self._synced.set()
        self._wake()

    def _stream(self) -> None:
        self._watcher = watch.Watch()
        stream = self._watcher.stream(
            self.core.list_namespaced_pod,
            self.namespace,
            label_selector=TRAINING_LABEL,
            resource_version=self._resource_version,
            allow_watch_bookmarks=True,
            timeout_seconds=WATCH_SECONDS,
        )
        for event in stream:
            if self._stopping.is_set():
                return
            kind = event.get("type")
            raw = event.get("raw_object")
            if not isinstance(raw, dict):
                continue
            if kind == "ERROR":  # what the client does not raise itself
                code = raw.get("code")
                raise ApiException(status=code if isinstance(code, int) else 500)
            version = _meta(raw).get("resourceVersion")
            if isinstance(version, str) and version:
                self._resource_version = version
            if kind in ("ADDED", "MODIFIED", "DELETED"):
                self._apply(kind, raw)

    def _apply(self, kind: str, pod: Pod) -> None:
        training, name, uid = training_of(pod), _meta(pod).get("name"), _meta(pod).get("uid")
        if training is None or not isinstance(name, str):
            return
        with self._lock:
            if uid in self._forgotten:
                return
            live = self._live.setdefault(training, {})
            if kind == "DELETED":
                known = live.get(name)
                if known is not None and _meta(known).get("uid") == uid:
                    del live[name]
                    self._gone.setdefault(training, {})[name] = pod
            else:
                live[name] = pod
                self._gone.get(training, {}).pop(name, None)
            if not live:
                del self._live[training]
            self._mark(training)
            self._lock.notify_all()
        self._wake()

    def _wake(self) -> None:
        with self._lock:
            wakes = list(self._wakes)
        for wake in wakes:
            try:
                wake()
            except Exception:
                log.exception("a pod change's wake-up failed")
