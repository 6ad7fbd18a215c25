"""The pod log fallback: where a learner's agent never ran or could not send its output,
what its pod's containers said (their pod logs, capped and cleaned by pod_logs) is
appended to the learner's log in the platform's log store, once per pod."""

from __future__ import annotations

import logging
from collections.abc import Callable

from kubernetes import client
from kubernetes.client.rest import ApiException

from service.domain.names import label_value
from service.logs import LogStore
from service.logs.base import LogRecord
from worker.backends.kubernetes import pod_logs
from worker.backends.kubernetes.objects import LEARNER_LABEL
from worker.backends.kubernetes.observation import labels
from worker.backends.kubernetes.pod_watch import PodWatch

log = logging.getLogger("worker.backends.kubernetes.backend")


class PodLogFallback:
    def __init__(
        self,
        core: client.CoreV1Api,
        namespace: str,
        watch: PodWatch,
        log_store: LogStore | None,
        clock: Callable[[], float],
    ) -> None:
        self.core = core
        self.namespace = namespace
        self.watch = watch
        self.log_store = log_store
        self.clock = clock
        self._read: set[str] = set()  # the pods (uids) whose logs were appended already

    def append(self, training_id: str) -> None:
        """For each pod of the training whose agent never ran or could not send the
        learner's output (pod_logs.containers_to_read), append what its containers said
        (their pod logs, at most pod_logs.POD_LOG_BYTES a pod) to the learner's log in the
        log store, once per pod. Called by stop and cleanup (a FINALIZE, or the end of an
        attempt), never by observe: the monitor's pass makes no API call. Best effort: a
        log that cannot be read or appended is logged here and the stop goes on. A pod
        kept for DLAAS_K8S_POD_TTL_SECONDS and finalized again by a restarted worker may
        have its logs appended twice."""
        if self.log_store is None:
            return
        for name, pod in sorted(self.watch.pods(label_value(training_id)).live.items()):
            uid = str(pod.get("metadata", {}).get("uid") or name)
            containers = pod_logs.containers_to_read(pod)
            learner = labels(pod).get(LEARNER_LABEL, "")
            if uid in self._read or not containers or not learner.isdigit():
                continue
            lines = self._lines(name, containers)
            if not lines:
                continue
            now = self.clock()
            try:
                self.log_store.append(training_id, [LogRecord(int(learner), now, x) for x in lines])
            except Exception:
                log.exception("appending the pod log of %s to %s's log failed", name, training_id)
                continue
            self._read.add(uid)

    def _lines(self, name: str, containers: tuple[str, ...]) -> list[str]:
        lines: list[str] = []
        left = pod_logs.POD_LOG_BYTES
        for container in containers:
            if left <= 0:
                break
            try:
                response = self.core.read_namespaced_pod_log(
                    name,
                    self.namespace,
                    container=container,
                    limit_bytes=left + 1,
                    _preload_content=False,
                )
            except ApiException as e:
                if e.status not in (400, 404):  # no log: the container never ran after all
                    log.warning("reading the log of %s/%s failed: %s", name, container, e)
                continue
            data: bytes = response.data
            lines += pod_logs.log_lines(container, data[:left], cut=len(data) > left)
            left -= len(data)
        return lines
