"""The Kubernetes backend: each training's learners as pods in one namespace, created with
the official client under the chart's Role (pods, services and secrets: create, get, list,
watch, delete; nothing else), and observed from one watch (pod_watch) instead of polling.

- start: the headless Service first (the owner: every other object of the training names
  it in ownerReferences, so deleting it has the cluster delete them all), then the Secret
  with the learners' specs (and an MPI key pair), then one pod per learner, the primary
  learners' first (a parameter server is none: a half-made start still names a primary,
  as an Observation must). The training's NetworkPolicy (network.py) is created right
  after the Service, before the Secret and any pod. An object that
  already exists (409) was created by an earlier call: a second start creates nothing.
  A start that fails deletes what it created, then raises. Objects of an older attempt
  still there (kept for debugging) are deleted first.
- observe: from the watch's cache only, each pod read by pod_states; a learner whose pod
  is gone is LOST (one not seen yet is PENDING while its training's start is recent); the
  attempt and the primaries from the pods' labels.
- stop: the training's pods that still run deleted with the grace period, waiting
  (bounded) until the watch has seen them go; those that ended run nothing and stay.
- cleanup: the Secret, the pods, the NetworkPolicy and the Service deleted one by one (the
  garbage collector would cascade from the Service, in its own time: a restarted start
  must not find them).
  With DLAAS_K8S_POD_TTL_SECONDS the pods of ended learners and their Service are kept
  that long after the last one ended (the Secret, with the credentials, never); the
  monitor's FINALIZE of held trainings deletes them once it has passed.
- Checkpoints: each pod has its own CHECKPOINT_DIR (in `work`, an emptyDir) that the
  platform cannot read, so the pod's steps move it: each learner's spec names where its
  agent saves it when the command ends or is stopped (`keys.learner_checkpoints_prefix`
  of the attempt's prefix) and the last attempt's saved one, which fetch restores (the
  learner's own part) before the command runs. save_checkpoints counts what the agents
  saved.

Gang scheduling (DLAAS_K8S_GANG, gang.py): with `kueue` the pods carry Kueue's pod-group
labels and the backend counts no slots (Kueue admits the group); with `coscheduling` a
PodGroup (owned by the Service, created before the pods, deleted with them) and the
pods name its scheduler.

Everything is keyed by the cluster's labels, so a new backend (a restarted worker or
monitor) reconciles from the cluster: nothing forgotten, nothing created twice.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import logging
import os
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any

from kubernetes import client, config
from kubernetes.client.rest import ApiException

from service.domain.admission import Candidate
from service.domain.catalog import ComputeSpec
from service.domain.egress import EgressRules
from service.domain.names import label_value
from service.logs import LogStore, open_log_store
from service.logs.redis_users import RedisLogUsers
from service.settings import Settings
from service.storage import scoped
from service.storage.base import ObjectStore
from worker.backends.base import Observation, StartRequest
from worker.backends.kubernetes import credentials, layout, pod_states
from worker.backends.kubernetes.capacity import ClusterFit
from worker.backends.kubernetes.fitting import CapacityView
from worker.backends.kubernetes.gang import GangConfig, gang_pod, pod_group
from worker.backends.kubernetes.learner_setup import LearnerSetup, ssh_key_pair
from worker.backends.kubernetes.network import training_network_policy
from worker.backends.kubernetes.objects import (
    ATTEMPT_LABEL,
    TRAINING_LABEL,
    ClusterConfig,
    Owner,
    TrainingObjectsInput,
    headless_service,
    learner_pod,
    secret_name,
    training_secret,
)
from worker.backends.kubernetes.observation import Pod, TrainingPods, labels, observation
from worker.backends.kubernetes.pod_groups import PodGroups
from worker.backends.kubernetes.pod_log_fallback import PodLogFallback
from worker.backends.kubernetes.pod_watch import PodWatch
from worker.launchers import plan_launch
from worker.launchers.plan import Addressing, first_host_index, learner_name_prefix

log = logging.getLogger(__name__)

# What stop() waits for the watch to see the pods gone, beyond the grace period.
STOP_MARGIN_SECONDS = 10.0
# Pod phases in which no container runs any more.
_ENDED_PHASES = ("Succeeded", "Failed")
# held() lists the Services at most this often (the monitor asks every pass).
HELD_REFRESH_SECONDS = 10.0
# The Service names its training's id in full (a label value may be shortened).
TRAINING_ANNOTATION = "dlaas.io/training-id"
# The slots a backend whose cluster has a gang scheduler reports: the scheduler, not the
# platform, decides when a training's learners fit (DLAAS_K8S_GANG).
UNCOUNTED_SLOTS = 10**9


def api_client() -> client.ApiClient:
    """The official client, configured in the cluster (a pod's service account) where
    KUBERNETES_SERVICE_HOST is set, else from KUBECONFIG (or ~/.kube/config)."""
    configuration = client.Configuration()
    if os.environ.get("KUBERNETES_SERVICE_HOST"):
        config.load_incluster_config(client_configuration=configuration)
    else:
        # Read now: the client's own default is KUBECONFIG as it was when it was imported.
        config.load_kube_config(
            config_file=os.environ.get("KUBECONFIG") or None,
            client_configuration=configuration,
        )
    return client.ApiClient(configuration)


class KubernetesBackend:
    def __init__(
        self,
        api: client.ApiClient,
        cluster: ClusterConfig,
        *,
        stop_grace_seconds: float = 3.0,
        pod_ttl_seconds: int = 0,
        image_pull_timeout: float = 300.0,
        slots: int = 1000,
        held_refresh_seconds: float = HELD_REFRESH_SECONDS,
        store_attempts: int = 5,
        store_retry_seconds: float = 30.0,
        log_store: LogStore | None = None,
        store_role_arn: str | None = None,
        store_session_max_seconds: int = scoped.MAX_SESSION_SECONDS,
        log_users: RedisLogUsers | None = None,
        egress: EgressRules | None = EgressRules(),
        clock: Callable[[], float] = time.time,
        gang: GangConfig | None = None,
        capacity_sync_seconds: float = 5.0,
    ) -> None:
        self.api = api
        self.core = client.CoreV1Api(api)
        self.gang = gang or GangConfig()
        self.pod_groups = PodGroups(api, cluster.namespace)
        self.networking = client.NetworkingV1Api(api)
        # Each training's NetworkPolicy allows its pods this egress (network.py); None:
        # no policy is created (DLAAS_K8S_NETWORK_POLICY=false).
        self.egress = egress
        self.cluster = cluster
        self.namespace = cluster.namespace
        self.stop_grace_seconds = stop_grace_seconds
        self.pod_ttl_seconds = pod_ttl_seconds
        self.image_pull_timeout = image_pull_timeout
        self._slots = slots
        self.clock = clock
        # What the learners' specs and store credentials are made with (learner_setup).
        self.setup = LearnerSetup(
            stop_grace_seconds=stop_grace_seconds,
            store_attempts=store_attempts,
            store_retry_seconds=store_retry_seconds,
            store_role_arn=store_role_arn or None,
            store_session_max_seconds=store_session_max_seconds,
        )
        self.watch = PodWatch(self.core, self.namespace)
        # The training id of each training label this backend observed or started: what
        # changed() maps the watch's changed labels back to.
        self._ids: dict[str, str] = {}
        self._held: set[str] | None = None
        self._held_at = 0.0
        self._held_lock = threading.Lock()
        self.held_refresh_seconds = held_refresh_seconds
        # Where a pod's own log is appended when its agent never sent the learner's output.
        self.pod_log_fallback = PodLogFallback(
            self.core, self.namespace, self.watch, log_store, clock
        )
        # Each training's own log credentials (a Redis user); without log_users the
        # learners get the request's log sink as it is (a file sink, or tests).
        self.log_credentials = credentials.LogCredentials(log_users)
        # Admission from the cluster's capacity (fitting), unless a gang scheduler admits.
        self.capacity = CapacityView(
            self.core, self.watch, cluster.gpu_resource, capacity_sync_seconds
        )

    @classmethod
    def from_settings(cls, settings: Settings) -> KubernetesBackend:
        """The backend the settings describe; credentials.StoreCredentialsRefused without
        a role to assume, unless DLAAS_K8S_ALLOW_PLATFORM_STORE_CREDENTIALS=true."""
        credentials.check_store_credentials(settings)
        url = settings.resolved_log_store_url
        return cls(
            api_client(),
            ClusterConfig.from_settings(settings),
            stop_grace_seconds=settings.stop_grace_seconds,
            pod_ttl_seconds=settings.k8s_pod_ttl_seconds,
            image_pull_timeout=settings.k8s_image_pull_timeout,
            slots=settings.k8s_slots,
            store_attempts=settings.store_retry_attempts,
            store_retry_seconds=settings.store_retry_seconds,
            log_store=_platform_log_store(settings),
            store_role_arn=settings.store_role_arn,
            store_session_max_seconds=settings.store_session_max_seconds,
            gang=GangConfig.from_settings(settings),
            log_users=RedisLogUsers(url) if url else None,
            egress=_egress_rules(settings),
            capacity_sync_seconds=settings.k8s_capacity_sync_seconds,
        )

    def close(self) -> None:
        self.watch.close()
        self.log_credentials.close()
        self.capacity.close()

    # -- what the platform asks of any backend -------------------------------------------

    def unsandboxed_reason(self) -> str | None:
        return None  # the user's command runs in its own pod, without credentials

    def slots(self) -> int:
        """Learners admitted at once where fit() does not decide (the nodes cannot be
        read). With a gang scheduler (DLAAS_K8S_GANG) uncounted: it holds a training's pods
        until all of them fit."""
        if self.gang.admits_without_capacity:
            return UNCOUNTED_SLOTS
        return self._slots

    def fit(
        self, starting: Sequence[Candidate], computes: Mapping[str, ComputeSpec]
    ) -> ClusterFit | None:
        """What fits the nodes now (fitting.CapacityView); None (the slots decide) where a
        gang scheduler admits (DLAAS_K8S_GANG) or the nodes cannot be read."""
        if self.gang.admits_without_capacity:
            return None
        return self.capacity.fit(starting, computes)

    @contextlib.contextmanager
    def changes(self, wake: Callable[[], None]) -> Iterator[None]:
        self.watch.ensure_started()
        unsubscribe = self.watch.subscribe(wake)
        try:
            yield
        finally:
            unsubscribe()

    def save_checkpoints(self, training_id: str, store: ObjectStore, prefix: str) -> int | None:
        """The bytes the training's agents saved under `prefix` (the attempt's, each
        learner's CHECKPOINT_DIR below `learner-<i>/`): they save as their command ends or
        is stopped (the pods are stopped when this is called), so nothing is copied here.
        None when the backend holds no pod of the training, or no agent saved anything (a
        pod that never ran, a stop past the grace period): the caller then keeps the older
        attempt's checkpoints, to be restored again, instead of replacing them by nothing."""
        self.watch.ensure_started()
        if not self.watch.pods(label_value(training_id)):
            return None
        saved = [info.size for info in store.list(prefix)]
        return sum(saved) if saved else None

    # -- start -----------------------------------------------------------------------------

    def start(self, request: StartRequest) -> None:
        self.watch.ensure_started()
        spec = request.spec
        self._ids[label_value(spec.training_id)] = spec.training_id
        prefix = learner_name_prefix(spec.training_id)
        mpi_setup = layout.mpi_setup(spec.conventions) if spec.distribution == "mpi" else None
        addressing = Addressing.per_learner_hosts(
            prefix, spec.nodes, first_host_index(spec.conventions)
        )
        plan = plan_launch(spec, addressing, mpi_setup)
        log_sink, log_password = self.log_credentials.sink(request)
        created: list[tuple[str, str]] = []
        try:
            inp = self.setup.objects_input(
                request,
                plan,
                Owner(prefix, "", kind="Service"),
                ssh_key_pair() if mpi_setup else None,
                log_sink,
            )
            owner = self._create_service(inp, created)
            inp = dataclasses.replace(inp, owner=owner)
            if self.egress is not None:  # before any pod: none runs unisolated
                policy = training_network_policy(inp, self.cluster, self.egress)
                self._create("networkpolicies", policy, created)
            secret = self._create("secrets", training_secret(inp, self.cluster), created)
            self.log_credentials.settle(
                spec.training_id, log_password, new_secret=secret is not None
            )
            if self.gang.kind == "coscheduling":
                self._create_pod_group(inp, created)
            # The primaries' pods first: a start observed half-way (by this backend's cache,
            # or another process's watch) must name a primary, or its report is malformed.
            for lp in sorted(plan.learners, key=lambda lp: not lp.primary):
                body = gang_pod(
                    learner_pod(inp, lp, self.cluster), prefix, len(plan.learners), self.gang
                )
                pod = self._create("pods", body, created)
                if pod is not None:
                    self.watch.put(pod)
        except Exception:
            self._delete_created(created)
            if ("services", prefix) in created:  # all of it was this call's: none is left
                self.watch.forget(label_value(spec.training_id))
            self.log_credentials.take_back(spec.training_id, log_password)
            raise
        with self._held_lock:
            if self._held is not None:
                self._held.add(spec.training_id)

    def _create_service(self, inp: TrainingObjectsInput, created: list[tuple[str, str]]) -> Owner:
        """Create the owner (or find the one an earlier start created) and return it as
        the others' owner; one of an older attempt is deleted with all it owns first."""
        body = headless_service(inp, self.cluster)
        del body["metadata"]["ownerReferences"]  # it is the owner
        body["metadata"]["labels"][ATTEMPT_LABEL] = str(inp.attempt)
        body["metadata"]["annotations"] = {TRAINING_ANNOTATION: inp.training_id}
        for _ in range(3):
            try:
                service = self.core.create_namespaced_service(
                    self.namespace, body, _preload_content=False
                )
                found = json.loads(service.data)
                created.append(("services", inp.prefix))
            except ApiException as e:
                if e.status != 409:
                    raise
                found = json.loads(
                    self.core.read_namespaced_service(
                        inp.prefix, self.namespace, _preload_content=False
                    ).data
                )
                attempt = labels(found).get(ATTEMPT_LABEL, "1")
                if not attempt.isdigit() or int(attempt) < inp.attempt:
                    log.info("deleting what is left of %s's attempt %s", inp.training_id, attempt)
                    self._delete_all(inp.training_id, wait=True)
                    continue
            return Owner(inp.prefix, found["metadata"]["uid"], kind="Service")
        raise RuntimeError(f"the Service {inp.prefix} of an older attempt could not be replaced")

    def _create(
        self, kind: str, body: dict[str, Any], created: list[tuple[str, str]]
    ) -> Pod | None:
        """Create one object; None if it already existed (an earlier start made it)."""
        name = body["metadata"]["name"]
        create = {
            "secrets": self.core.create_namespaced_secret,
            "pods": self.core.create_namespaced_pod,
            "networkpolicies": self.networking.create_namespaced_network_policy,
        }[kind]
        try:
            response = create(self.namespace, body, _preload_content=False)
        except ApiException as e:
            if e.status == 409:
                return None
            raise
        created.append((kind, name))
        result: Pod = json.loads(response.data)
        return result

    def _create_pod_group(self, inp: TrainingObjectsInput, created: list[tuple[str, str]]) -> None:
        """The training's PodGroup, owned by its Service (one that exists already was made
        by an earlier start)."""
        service = headless_service(inp, self.cluster)["metadata"]
        body = pod_group(
            inp.prefix,
            self.namespace,
            len(inp.plan.learners),
            service["labels"],
            service["ownerReferences"],
        )
        if self.pod_groups.create(body):
            created.append(("podgroups", inp.prefix))

    def _delete_created(self, created: list[tuple[str, str]]) -> None:
        for kind, name in reversed(created):
            try:
                self._delete(kind, name, grace=0)
            except Exception:
                log.exception("deleting %s %s after a failed start failed", kind, name)

    # -- observe ---------------------------------------------------------------------------

    def observe(self, training_id: str) -> Observation | None:
        self.watch.ensure_started()
        training = label_value(training_id)
        self._ids[training] = training_id
        pods = self.watch.pods(training)
        if not pods:
            return None
        return observation(pods, self.clock(), self.image_pull_timeout)

    # -- stop, clean up, held ----------------------------------------------------------------

    def stop(self, training_id: str) -> None:
        """Delete the pods that still run something (a pod that ended, Succeeded or Failed,
        holds no process: it stays for cleanup, and the TTL) and wait until they are gone."""
        self.watch.ensure_started()
        training = label_value(training_id)
        self.pod_log_fallback.append(training_id)  # before the pods, and their logs, are gone
        running = [
            name
            for name, pod in self.watch.pods(training).live.items()
            if (pod.get("status") or {}).get("phase") not in _ENDED_PHASES
        ]
        for name in running:
            self._delete("pods", name, grace=round(self.stop_grace_seconds))
        timeout = self.stop_grace_seconds + STOP_MARGIN_SECONDS
        if not self.watch.wait_gone(training, timeout, names=running):
            log.warning(
                "the pods of %s were still there %.0f s after deletion", training_id, timeout
            )

    def cleanup(self, training_id: str) -> None:
        self.watch.ensure_started()
        training = label_value(training_id)
        prefix = learner_name_prefix(training_id)
        self.pod_log_fallback.append(training_id)
        # The credentials go at once, whatever is kept for debugging.
        self._delete("secrets", secret_name(prefix), grace=0)
        self.log_credentials.delete(training_id)
        if self._kept_for_debugging(self.watch.pods(training)):
            return
        self._delete_all(training_id, wait=False)

    def _kept_for_debugging(self, pods: TrainingPods) -> bool:
        """Whether the pods (all ended) are within DLAAS_K8S_POD_TTL_SECONDS of the last end."""
        if self.pod_ttl_seconds <= 0 or not pods.live:
            return False
        ends = [_finished_at(pod) for pod in pods.live.values()]
        if any(end is None for end in ends):
            return False
        return self.clock() < max(e for e in ends if e is not None) + self.pod_ttl_seconds

    def _delete_all(self, training_id: str, *, wait: bool) -> None:
        """Every object of the training, by label (what a restarted backend finds too)."""
        training = label_value(training_id)
        selector = f"{TRAINING_LABEL}={training}"
        for pod in self._list("pods", selector):
            self._delete("pods", pod["metadata"]["name"], grace=0)
        # By name: the backend may not list or read Secrets (the chart's Role), so that it
        # never reads the platform's.
        self._delete("secrets", secret_name(learner_name_prefix(training_id)), grace=0)
        if self.egress is not None:
            for policy in self._list("networkpolicies", selector):
                self._delete("networkpolicies", policy["metadata"]["name"], grace=0)
        if self.gang.kind == "coscheduling":
            for name in self.pod_groups.names(selector):
                self.pod_groups.delete(name)
        for service in self._list("services", selector):
            self._delete("services", service["metadata"]["name"], grace=0)
        if wait:
            self.watch.wait_gone(training, STOP_MARGIN_SECONDS)
        self.watch.forget(training)
        self._ids.pop(training, None)
        with self._held_lock:
            if self._held is not None:
                self._held.discard(training_id)

    def changed(self) -> set[str] | None:
        """The trainings whose pods the watch saw change since the last call; None (the
        monitor then reconciles every training) before the watch runs, after it listed
        again, or when a changed pod is of a training this backend never observed or
        started (one another process started, before this monitor's first full pass)."""
        if not self.watch.running():
            return None
        labels = self.watch.drain_changes()
        if labels is None:
            return None
        ids = set()
        for label in labels:
            training_id = self._ids.get(label)
            if training_id is None:
                return None
            ids.add(training_id)
        return ids

    def held(self) -> list[str]:
        """The trainings whose Service exists (their owner: what is left of them), read
        again at most every `held_refresh_seconds`; cleanups and starts here update it."""
        with self._held_lock:
            now = time.monotonic()
            if self._held is None or now - self._held_at > self.held_refresh_seconds:
                self._held = {
                    _training_id(service)
                    for service in self._list("services", TRAINING_LABEL)
                    if _training_id(service)
                }
                self._held_at = now
            return sorted(self._held)

    # -- the API -------------------------------------------------------------------------------

    def _list(self, kind: str, selector: str) -> list[dict[str, Any]]:
        lister = {
            "pods": self.core.list_namespaced_pod,
            "services": self.core.list_namespaced_service,
            "networkpolicies": self.networking.list_namespaced_network_policy,
        }[kind]
        response = lister(self.namespace, label_selector=selector, _preload_content=False)
        items = json.loads(response.data).get("items") or []
        return [item for item in items if isinstance(item, dict)]

    def _delete(self, kind: str, name: str, *, grace: int) -> None:
        """Delete one object; one already gone is fine."""
        if kind == "podgroups":
            self.pod_groups.delete(name)
            return
        delete = {
            "pods": self.core.delete_namespaced_pod,
            "secrets": self.core.delete_namespaced_secret,
            "services": self.core.delete_namespaced_service,
            "networkpolicies": self.networking.delete_namespaced_network_policy,
        }[kind]
        try:
            delete(name, self.namespace, grace_period_seconds=grace, _preload_content=False)
        except ApiException as e:
            if e.status != 404:
                raise


def _platform_log_store(settings: Settings) -> LogStore:
    """The platform's log store, as service.platform.Platform opens it: Redis where the
    settings name one (what pods can reach), else the files under DLAAS_HOME."""
    url = settings.resolved_log_store_url
    if url:
        return open_log_store("redis", url=url)
    return open_log_store("file", dir=str(settings.home_dir / "logs"))


def _egress_rules(settings: Settings) -> EgressRules | None:
    """What each training's NetworkPolicy lets its pods reach (DLAAS_K8S_EGRESS_*), or
    None without DLAAS_K8S_NETWORK_POLICY."""
    if not settings.k8s_network_policy:
        return None
    return settings.k8s_egress_rules


def _training_id(service: dict[str, Any]) -> str:
    """The training id a Service is of: its annotation (the label may be shortened)."""
    annotations = service.get("metadata", {}).get("annotations") or {}
    value = annotations.get(TRAINING_ANNOTATION) or labels(service).get(TRAINING_LABEL)
    return value if isinstance(value, str) else ""


def _finished_at(pod: Pod) -> float | None:
    """When the pod's learner container ended, or None while it has not."""
    state = pod_states.container_status(pod, pod_states.LEARNER).get("state") or {}
    return pod_states.parse_time((state.get("terminated") or {}).get("finishedAt"))
