"""Gang scheduling on the emulated cluster: the schedulers a cluster may already run
(DLAAS_K8S_GANG: Kueue's pod groups, scheduler-plugins' coscheduling PodGroup) and the
release of a gang the cluster could not place (DLAAS_K8S_UNSCHEDULABLE_SECONDS), through
the official client, the monitor and the worker's execution as tests/k8s/test_platform.py
runs them."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import jsonschema
import pytest
from fastapi.testclient import TestClient
from kubernetes import client, config

from service.db import repository
from service.dispatch import FINALIZE, LAUNCH, STOP
from service.platform import Platform
from service.settings import Settings
from tests.conftest import ADMIN_KEY, create_tenant, submit
from tests.deploy.chart import objects as chart_objects
from tests.k8s.conftest import NAMESPACE
from tests.k8s.kubelet import RUN, ended, kubelet, unschedulable
from tests.k8s.test_backend import CLUSTER, PREFIX, SELECTOR, TRAINING, eventually, request
from tests.k8s.test_platform import Outbox, until
from tests.k8s_emulator import RunningApiserver
from tests.manifest_cases import base
from tests.unit.test_k8s_gang import POD_GROUP_SCHEMA
from worker import execution
from worker.backends import make_backend
from worker.backends.kubernetes.backend import KubernetesBackend
from worker.backends.kubernetes.gang import (
    KUEUE_GROUP_LABEL,
    KUEUE_QUEUE_LABEL,
    KUEUE_TOTAL_ANNOTATION,
    POD_GROUP_GROUP,
    POD_GROUP_LABEL,
    POD_GROUP_PLURAL,
    POD_GROUP_VERSION,
    GangConfig,
)
from worker.launchers.plan import learner_name_prefix
from worker.monitor import Monitor

COSCHEDULING = GangConfig(kind="coscheduling", scheduler_name="sched-plugins")


def pod_groups(api: client.ApiClient, selector: str = SELECTOR) -> list[dict[str, Any]]:
    listed = client.CustomObjectsApi(api).list_namespaced_custom_object(
        POD_GROUP_GROUP, POD_GROUP_VERSION, NAMESPACE, POD_GROUP_PLURAL, label_selector=selector
    )
    items: list[dict[str, Any]] = listed["items"]
    return items


@pytest.fixture
def cosched_backend(k8s_api: client.ApiClient) -> Iterator[KubernetesBackend]:
    backend = KubernetesBackend(k8s_api, CLUSTER, stop_grace_seconds=1, gang=COSCHEDULING)
    try:
        yield backend
    finally:
        backend.close()


# -- coscheduling: the backend -----------------------------------------------------------------


def test_with_coscheduling_a_pod_group_of_every_learner_is_created_and_deleted_with_them(
    cosched_backend: KubernetesBackend, k8s_api: client.ApiClient, core: client.CoreV1Api
) -> None:
    cosched_backend.start(request())
    (group,) = pod_groups(k8s_api)
    stored = {k: v for k, v in group.items() if k != "status"}
    stored["metadata"] = {
        k: v
        for k, v in group["metadata"].items()
        if k not in ("uid", "creationTimestamp", "resourceVersion")  # the server's own
    }
    jsonschema.validate(stored, POD_GROUP_SCHEMA)
    assert group["metadata"]["name"] == PREFIX
    assert group["spec"] == {"minMember": 2}
    service = core.read_namespaced_service(PREFIX, NAMESPACE)
    (owner,) = group["metadata"]["ownerReferences"]
    assert (owner["kind"], owner["name"], owner["uid"]) == ("Service", PREFIX, service.metadata.uid)

    pods = core.list_namespaced_pod(NAMESPACE, label_selector=SELECTOR).items
    assert len(pods) == 2
    for pod in pods:
        assert pod.metadata.labels[POD_GROUP_LABEL] == PREFIX
        assert pod.spec.scheduler_name == "sched-plugins"

    cosched_backend.start(request())  # a second start creates nothing
    assert len(pod_groups(k8s_api)) == 1

    cosched_backend.cleanup(TRAINING)
    assert pod_groups(k8s_api) == []
    assert core.list_namespaced_pod(NAMESPACE, label_selector=SELECTOR).items == []


def test_the_pod_group_goes_with_the_trainings_service(
    cosched_backend: KubernetesBackend, k8s_api: client.ApiClient, core: client.CoreV1Api
) -> None:
    cosched_backend.start(request())
    assert len(pod_groups(k8s_api)) == 1
    core.delete_namespaced_service(PREFIX, NAMESPACE)  # the garbage collector's cascade
    eventually(lambda: pod_groups(k8s_api) == [])


def test_a_failed_start_deletes_the_pod_group_it_created(
    cosched_backend: KubernetesBackend,
    k8s_api: client.ApiClient,
    core: client.CoreV1Api,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    def refuse(*args: Any, **kwargs: Any) -> Any:
        raise client.ApiException(status=403, reason="Forbidden")

    monkeypatch.setattr(cosched_backend.core, "create_namespaced_pod", refuse)
    with pytest.raises(client.ApiException):
        cosched_backend.start(request())
    assert pod_groups(k8s_api) == []
    assert core.list_namespaced_service(NAMESPACE, label_selector=SELECTOR).items == []


def test_without_a_gang_scheduler_no_pod_group_is_made(
    k8s_api: client.ApiClient, core: client.CoreV1Api
) -> None:
    backend = KubernetesBackend(k8s_api, CLUSTER, stop_grace_seconds=1)
    try:
        backend.start(request())
        assert pod_groups(k8s_api) == []
        for pod in core.list_namespaced_pod(NAMESPACE, label_selector=SELECTOR).items:
            assert pod.spec.scheduler_name in (None, "default-scheduler")
            assert POD_GROUP_LABEL not in pod.metadata.labels
            assert KUEUE_GROUP_LABEL not in pod.metadata.labels
        assert backend.slots() == 1000
    finally:
        backend.close()


def _requests_made(api: client.ApiClient) -> set[tuple[str, str, str]]:
    """(API group, resource, verb) of every request made through `api`, as RBAC names
    them: the core API's paths (/api/v1/namespaces/N/R[/name[/sub]]) and the named
    groups' (/apis/G/V/namespaces/N/R[/name])."""
    used: set[tuple[str, str, str]] = set()
    call = api.call_api

    def recorded(resource_path: str, method: str, *args: Any, **kwargs: Any) -> Any:
        params = dict(args[0] or {}) if args else dict(kwargs.get("path_params") or {})
        parts = resource_path.strip("/").split("/")
        group = "" if parts[0] == "api" else params.get("group", parts[1])
        rest = parts[parts.index("namespaces") + 2 :]
        resource = params.get("plural", rest[0]) + ("/" + rest[2] if len(rest) > 2 else "")
        named = len(rest) > 1
        query = dict(args[1] or []) if len(args) > 1 else dict(kwargs.get("query_params") or [])
        verb = {
            "POST": "create",
            "PUT": "update",
            "PATCH": "patch",
            "DELETE": "delete" if named else "deletecollection",
        }.get(method, "get" if named else ("watch" if query.get("watch") else "list"))
        used.add((group, resource, verb))
        return call(resource_path, method, *args, **kwargs)

    api.call_api = recorded
    return used


def _role_allows(values: dict[str, Any]) -> set[tuple[str, str, str]]:
    (role,) = [o for o in chart_objects(values) if o["kind"] == "Role"]
    return {
        (group, resource, verb)
        for rule in role["rules"]
        for group in rule["apiGroups"]
        for resource in rule["resources"]
        for verb in rule["verbs"]
    }


def test_the_charts_role_allows_the_pod_groups_only_with_coscheduling(
    k8s_apiserver: RunningApiserver, core: client.CoreV1Api
) -> None:
    """What the backend does with coscheduling is what the chart's Role allows when
    learners.gang.scheduler=coscheduling, and without it the Role names no PodGroup."""
    cosched = _role_allows({"learners": {"gang": {"scheduler": "coscheduling"}}})
    for values in (None, {"learners": {"gang": {"scheduler": "kueue"}}}):
        assert not [r for r in _role_allows(values or {}) if r[0] == POD_GROUP_GROUP]

    api = config.new_client_from_config(config_file=str(k8s_apiserver.kubeconfig))
    used = _requests_made(api)
    backend = KubernetesBackend(api, CLUSTER, stop_grace_seconds=1, gang=COSCHEDULING)
    try:
        backend.start(request())
        backend.start(request())
        kubelet(core, f"{PREFIX}-1", "Running", ended(0), RUN, RUN)
        eventually(lambda: backend.observe(TRAINING) is not None)
        backend.stop(TRAINING)
        backend.cleanup(TRAINING)
        backend.start(request(attempt=2))
        backend.cleanup(TRAINING)
    finally:
        backend.close()
        api.close()
    assert {r for r in used if r[0] == POD_GROUP_GROUP} == {
        (POD_GROUP_GROUP, "podgroups", "create"),
        (POD_GROUP_GROUP, "podgroups", "list"),
        (POD_GROUP_GROUP, "podgroups", "delete"),
    }
    assert used - cosched == set()


# -- through the platform ------------------------------------------------------------------------


@pytest.fixture
def gang() -> str:
    return "none"


@pytest.fixture
def settings(
    tmp_path: Path,
    database_url: str,
    k8s_apiserver: RunningApiserver,
    monkeypatch: pytest.MonkeyPatch,
    gang: str,
) -> Settings:
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
    monkeypatch.setenv("KUBECONFIG", str(k8s_apiserver.kubeconfig))
    return Settings(
        home=tmp_path / "home",
        runtimes_dir=tmp_path / "runtimes",
        database_url=database_url,
        admin_api_key=ADMIN_KEY,
        allowed_data_endpoints="127.0.0.1:9000",
        backend="kubernetes",
        k8s_namespace=NAMESPACE,
        k8s_image_prefix="registry.example.com/dlaas/",
        k8s_image_tag="1.0",
        # The local store: no role for the pods to assume, accepted explicitly.
        k8s_allow_platform_store_credentials=True,
        k8s_gang=gang,  # type: ignore[arg-type]
        k8s_kueue_queue="gpu-queue",
        # With a gang scheduler, one learner slot: what the platform's own admission
        # would count, and must not.
        k8s_slots=1 if gang != "none" else 1000,
        k8s_unschedulable_seconds=300,
    )


@pytest.fixture
def k8s_backend(
    platform: Platform, settings: Settings, monkeypatch: pytest.MonkeyPatch
) -> Iterator[tuple[Outbox, KubernetesBackend]]:
    outbox = Outbox()
    monkeypatch.setattr(platform, "dispatcher", outbox)
    backend = make_backend(settings)
    assert isinstance(backend, KubernetesBackend)
    try:
        yield outbox, backend
    finally:
        backend.close()


def submit_two_learners(client: TestClient, headers: dict[str, str], name: str) -> str:
    manifest = base(
        name=name,
        framework={"name": "tensorflow-horovod", "version": "2.21"},
        compute_configuration={"name": "P100", "nodes": 2},
    )
    r = submit(client, headers, json.dumps(manifest))
    assert r.status_code == 201, r.text
    tid: str = r.json()["id"]
    return tid


@pytest.mark.parametrize("gang", ["kueue"])
def test_with_kueue_the_pods_are_one_pod_group_and_the_platform_admits_without_counting(
    client: TestClient,
    platform: Platform,
    core: client.CoreV1Api,
    k8s_backend: tuple[Outbox, KubernetesBackend],
) -> None:
    """Two 2-learner trainings with one learner slot: the platform's own admission would
    fail both (they can never fit); with Kueue both are admitted and their pods wait for
    Kueue, each as one pod group of 2 in the LocalQueue."""
    outbox, backend = k8s_backend
    headers = create_tenant(client, "acme")
    ids = [submit_two_learners(client, headers, f"t{i}") for i in range(2)]
    monitor = Monitor(platform, backend)
    monitor.tick()
    assert sorted(outbox.sent) == sorted((LAUNCH, tid) for tid in ids)
    for tid in ids:
        assert client.get(f"/v1/trainings/{tid}", headers=headers).json()["status"] == "PENDING"
        execution.launch(platform, backend, tid)
        prefix = learner_name_prefix(tid)
        pods = core.list_namespaced_pod(NAMESPACE, label_selector=f"dlaas.io/training-id={tid}")
        assert len(pods.items) == 2
        for pod in pods.items:
            assert pod.metadata.labels[KUEUE_QUEUE_LABEL] == "gpu-queue"
            assert pod.metadata.labels[KUEUE_GROUP_LABEL] == prefix
            assert pod.metadata.annotations == {KUEUE_TOTAL_ANNOTATION: "2"}


def _status(client: TestClient, headers: dict[str, str], tid: str) -> dict[str, Any]:
    body: dict[str, Any] = client.get(f"/v1/trainings/{tid}", headers=headers).json()
    return body


def test_a_gang_left_unschedulable_is_released_and_queued_once_then_failed(
    client: TestClient,
    platform: Platform,
    core: client.CoreV1Api,
    k8s_backend: tuple[Outbox, KubernetesBackend],
) -> None:
    """Learner 1 gets a node and runs; learner 2's pod stays Unschedulable past
    DLAAS_K8S_UNSCHEDULABLE_SECONDS. The whole gang is released (its pods deleted, the
    GPUs learner 1 held free again) and the training queued again as attempt 2; the
    same again fails it, saying why."""
    outbox, backend = k8s_backend
    headers = create_tenant(client, "acme")
    tid = submit_two_learners(client, headers, "big")
    prefix = learner_name_prefix(tid)
    selector = f"dlaas.io/training-id={tid}"
    monitor = Monitor(platform, backend)
    monitor.tick()
    execution.launch(platform, backend, tid)

    kubelet(core, f"{prefix}-1", "Running", ended(0), RUN, RUN)
    unschedulable(core, f"{prefix}-2", since=-100)  # not long enough yet
    until(lambda: [lo.phase for lo in backend.observe(tid).learners] == ["RUNNING", "PENDING"])  # type: ignore[union-attr]
    outbox.sent.clear()
    monitor.tick()
    assert _status(client, headers, tid)["status"] == "PENDING"
    assert outbox.sent == []

    unschedulable(core, f"{prefix}-2", since=-301)
    until(lambda: backend.observe(tid).unschedulable[0].since < time.time() - 300)  # type: ignore[union-attr]
    monitor.tick()
    # Queued again as attempt 2, and (nothing else queued) admitted again in the pass.
    training = _status(client, headers, tid)
    message = "released: learner 2 could not be scheduled for 300 s; queued again"
    assert [(e["status"], e["message"], e["attempt"]) for e in training["status_history"]][-2:] == [
        ("QUEUED", message, 2),
        ("PENDING", "starting 2 learner(s)", 2),
    ]
    assert training["status"] == "PENDING"
    assert training["past_attempts"][-1]["message"] == message
    assert [lr["status_message"] for lr in training["past_attempts"][-1]["learners"]] == [
        "stopped by the platform: the training's learners could not all be placed"
    ] * 2
    with platform.sessions() as session:
        stored = repository.training_by_id(session, tid)
        assert stored is not None and stored.attempt == 2
    # The pods are stopped at once (the STOP the monitor sent, run by a worker), then the
    # LAUNCH starts attempt 2.
    assert outbox.sent == [(STOP, tid), (LAUNCH, tid)]
    execution.stop(backend, tid)
    assert core.list_namespaced_pod(NAMESPACE, label_selector=selector).items == []

    execution.launch(platform, backend, tid)
    pods = core.list_namespaced_pod(NAMESPACE, label_selector=selector).items
    assert sorted(p.metadata.name for p in pods) == [f"{prefix}-1", f"{prefix}-2"]
    assert {p.metadata.labels["dlaas.io/attempt"] for p in pods} == {"2"}

    # Attempt 2: learner 2 stays unschedulable again.
    kubelet(core, f"{prefix}-1", "Running", ended(0), RUN, RUN)
    unschedulable(core, f"{prefix}-2", since=-400)
    until(lambda: backend.observe(tid).attempt == 2 and backend.observe(tid).unschedulable)  # type: ignore[union-attr]
    outbox.sent.clear()
    monitor.tick()
    training = _status(client, headers, tid)
    assert training["status"] == "FAILED"
    assert training["status_message"] == (
        "released: learner 2 could not be scheduled for 300 s, after it was queued again "
        "1 time(s); failed: the cluster cannot place every learner at once"
    )
    assert outbox.sent == [(FINALIZE, tid)]
    execution.finalize(platform, backend, tid)
    assert core.list_namespaced_pod(NAMESPACE, label_selector=selector).items == []
