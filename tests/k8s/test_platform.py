"""The platform with DLAAS_BACKEND=kubernetes and KUBECONFIG pointing at the emulated API
server, as `dlaas up` runs it against a cluster: a training accepted through the REST API
(a Horovod one: its runtime is in its learner image, nothing to install here), admitted
by the monitor, launched by the worker's execution.launch, its objects created in the
cluster, and its state followed from the pods the kubelet (the test) updates."""

from __future__ import annotations

import base64
import json
import time
from collections.abc import Callable, Iterator
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient
from kubernetes import client

from service.db import repository
from service.db.models import utcnow
from service.dispatch import LAUNCH, STOP
from service.domain.catalog import GPU_PRODUCT_LABEL, P100_PRODUCT
from service.platform import Platform
from service.settings import Settings
from service.storage import keys
from tests.conftest import ADMIN_KEY, create_tenant, submit
from tests.k8s.conftest import NAMESPACE
from tests.k8s.kubelet import RUN, WAIT, ended, kubelet
from tests.k8s_emulator import RunningApiserver
from tests.manifest_cases import base
from worker import execution
from worker import monitor as monitor_module
from worker.backends import make_backend
from worker.backends.kubernetes.backend import KubernetesBackend
from worker.launchers.plan import learner_name_prefix
from worker.monitor import Monitor


@pytest.fixture
def settings(
    tmp_path: Path,
    database_url: str,
    k8s_apiserver: RunningApiserver,
    monkeypatch: pytest.MonkeyPatch,
) -> Settings:
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
    monkeypatch.setenv("KUBECONFIG", str(k8s_apiserver.kubeconfig))
    return Settings(
        home=tmp_path / "home",
        runtimes_dir=tmp_path / "runtimes",  # empty: no runtime is installed on this machine
        database_url=database_url,
        admin_api_key=ADMIN_KEY,
        allowed_data_endpoints="127.0.0.1:9000",
        backend="kubernetes",
        k8s_namespace=NAMESPACE,
        k8s_image_prefix="registry.example.com/dlaas/",
        k8s_image_tag="1.0",
        # A local store: the pods get no store credentials to scope.
        k8s_allow_platform_store_credentials=True,
    )


class Outbox:
    def __init__(self) -> None:
        self.sent: list[tuple[str, str]] = []

    def send(self, task: str, training_id: str) -> None:
        self.sent.append((task, training_id))


@pytest.fixture
def k8s_backend(
    platform: Platform, settings: Settings, monkeypatch: pytest.MonkeyPatch
) -> Iterator[tuple[Outbox, KubernetesBackend]]:
    """The Kubernetes backend on the emulated cluster, and the outbox standing for the
    dispatcher: the worker's tasks the platform sends are recorded, not run."""
    outbox = Outbox()
    monkeypatch.setattr(platform, "dispatcher", outbox)
    backend = make_backend(settings)
    assert isinstance(backend, KubernetesBackend)
    try:
        yield outbox, backend
    finally:
        backend.close()


def until(check: Callable[[], Any], timeout: float = 5.0) -> Any:
    deadline = time.monotonic() + timeout
    while not (value := check()):
        assert time.monotonic() < deadline, "the condition did not hold in time"
        time.sleep(0.02)
    return value


def submit_horovod(client: TestClient, **fields: Any) -> tuple[dict[str, str], str]:
    """A 2-learner Horovod training (its runtime is in its learner image) of a new tenant,
    submitted through the API: the tenant's headers and the training's id."""
    headers = create_tenant(client, "acme")
    manifest = base(
        framework={"name": "tensorflow-horovod", "version": "2.21"},
        compute_configuration={"name": "P100", "nodes": 2},
        **fields,
    )
    r = submit(client, headers, json.dumps(manifest))
    assert r.status_code == 201, r.text
    return headers, r.json()["id"]


def test_every_defined_runtime_counts_as_installed_on_kubernetes(platform: Platform) -> None:
    assert {"platform", "horovod-tf2.14", "ddl-tf2.14"} <= platform.installed_runtimes()
    horovod = platform.runtime("horovod-tf2.14")
    assert horovod is not None and horovod.prefix.startswith("/opt/dlaas/runtimes/horovod-tf2.14-")
    assert platform.runtime("no-such-runtime") is None


def test_a_training_submitted_through_the_api_runs_as_pods(
    client: TestClient,
    platform: Platform,
    core: client.CoreV1Api,
    k8s_backend: tuple[Outbox, KubernetesBackend],
) -> None:
    outbox, backend = k8s_backend
    headers, tid = submit_horovod(client)
    monitor = Monitor(platform, backend)

    monitor.tick()  # admitted, its launch sent to a worker
    assert outbox.sent == [(LAUNCH, tid)]
    execution.launch(platform, backend, tid)  # what the worker does with it

    prefix = learner_name_prefix(tid)
    selector = f"dlaas.io/training-id={tid}"
    pods = {p.metadata.name: p for p in core.list_namespaced_pod(NAMESPACE).items}
    assert sorted(pods) == [f"{prefix}-1", f"{prefix}-2"]
    for pod in pods.values():
        assert pod.spec.node_selector == {GPU_PRODUCT_LABEL: P100_PRODUCT}
        assert pod.spec.containers[0].image == (
            "registry.example.com/dlaas/learner-horovod-tf2.14:1.0"
        )
    (service,) = core.list_namespaced_service(NAMESPACE, label_selector=selector).items
    assert service.metadata.name == prefix
    assert len(core.list_namespaced_secret(NAMESPACE, label_selector=selector).items) == 1

    # The kubelet runs both learners: the monitor sees them from the watch.
    for name in pods:
        kubelet(core, name, "Running", ended(0), RUN, RUN)
    until(lambda: [lo.phase for lo in backend.observe(tid).learners] == ["RUNNING"] * 2)  # type: ignore[union-attr]
    monitor.tick()
    training = client.get(f"/v1/trainings/{tid}", headers=headers).json()
    assert training["status"] == "RUNNING"

    for name in pods:
        kubelet(core, name, "Succeeded", ended(0), ended(0), ended(0))
    until(lambda: [lo.phase for lo in backend.observe(tid).learners] == ["COMPLETED"] * 2)  # type: ignore[union-attr]
    monitor.tick()
    training = client.get(f"/v1/trainings/{tid}", headers=headers).json()
    assert training["status"] == "COMPLETED"


def test_a_retried_trainings_next_attempt_restores_the_checkpoints_its_pods_saved(
    client: TestClient,
    platform: Platform,
    core: client.CoreV1Api,
    tmp_path: Path,
    k8s_backend: tuple[Outbox, KubernetesBackend],
) -> None:
    """Attempt 1's agents saved each learner's CHECKPOINT_DIR under attempt-1/learner-<i>/
    (as tests/integration/test_pod_steps.py shows them do); its learners fail with a code
    the retry policy covers; attempt 2's learner specs restore attempt 1's checkpoints and
    save their own under attempt-2/, and the saved bytes count as the training's."""
    outbox, backend = k8s_backend
    headers, tid = submit_horovod(
        client, retry_policy={"max_retries": 1, "retry_on_exit_codes": [3]}
    )
    monitor = Monitor(platform, backend)
    monitor.tick()
    execution.launch(platform, backend, tid)
    prefix = learner_name_prefix(tid)
    selector = f"dlaas.io/training-id={tid}"

    def specs() -> dict[str, dict[str, Any]]:
        (secret,) = core.list_namespaced_secret(NAMESPACE, label_selector=selector).items
        return {
            name: json.loads(base64.b64decode(data))
            for name, data in secret.data.items()
            if name.startswith("learner-")
        }

    first = keys.attempt_checkpoints_prefix(tid, 1)
    assert {
        name: (s["checkpoints_prefix"], s["restore_checkpoints"]) for name, s in specs().items()
    } == {
        "learner-1.json": (f"{first}learner-1/", None),
        "learner-2.json": (f"{first}learner-2/", None),
    }

    # What attempt 1's agents saved, then its learners fail with exit code 3.
    for i, size in ((1, 1000), (2, 24)):
        (tmp_path / "ckpt").write_bytes(b"c" * size)
        platform.store.put_file(f"{first}learner-{i}/model.ckpt", tmp_path / "ckpt")
    for i in (1, 2):
        kubelet(core, f"{prefix}-{i}", "Failed", ended(0), ended(0), ended(3, "Error"))
    until(lambda: [lo.phase for lo in backend.observe(tid).learners] == ["FAILED"] * 2)  # type: ignore[union-attr]
    monitor.tick()  # attempt 2 recorded, its launch sent
    training = client.get(f"/v1/trainings/{tid}", headers=headers).json()
    assert training["status"] == "PENDING", training
    monitor.tick()
    assert outbox.sent[-1] == (LAUNCH, tid)
    execution.launch(platform, backend, tid)

    second = keys.attempt_checkpoints_prefix(tid, 2)
    assert {
        name: (s["checkpoints_prefix"], s["restore_checkpoints"]) for name, s in specs().items()
    } == {
        "learner-1.json": (f"{second}learner-1/", first),
        "learner-2.json": (f"{second}learner-2/", first),
    }
    pods = core.list_namespaced_pod(NAMESPACE, label_selector=selector).items
    assert {p.metadata.labels["dlaas.io/attempt"] for p in pods} == {"2"}
    with platform.sessions() as session:
        stored = repository.training_by_id(session, tid)
        assert stored is not None and stored.checkpoint_bytes == 1024


def test_the_pod_log_of_a_learner_whose_fetch_failed_is_in_the_trainings_logs(
    client: TestClient,
    platform: Platform,
    core: client.CoreV1Api,
    k8s_apiserver: RunningApiserver,
    k8s_backend: tuple[Outbox, KubernetesBackend],
) -> None:
    """Its agent never ran, so nothing sent its output: the platform reads the fetch
    container's log through the API when it finalizes the training."""
    _outbox, backend = k8s_backend
    headers, tid = submit_horovod(client)
    monitor = Monitor(platform, backend)
    monitor.tick()
    execution.launch(platform, backend, tid)
    prefix = learner_name_prefix(tid)
    reason = "learner wrapper: the code archive trainings/x.zip is not in the object store"
    k8s_apiserver.emulator.pod_logs[(NAMESPACE, f"{prefix}-1", "fetch")] = reason + "\n"
    kubelet(core, f"{prefix}-1", "Failed", ended(2, "Error"), WAIT, WAIT)
    kubelet(core, f"{prefix}-2", "Running", ended(0), RUN, RUN)
    until(lambda: [lo.phase for lo in backend.observe(tid).learners] == ["FAILED", "RUNNING"])  # type: ignore[union-attr]
    monitor.tick()
    assert client.get(f"/v1/trainings/{tid}", headers=headers).json()["status"] == "FAILED"
    execution.finalize(platform, backend, tid)  # the FINALIZE the monitor sent

    logs = client.get(f"/v1/trainings/{tid}/logs", headers=headers)
    assert logs.status_code == 200, logs.text
    lines = [line.split(" ", 1)[1] for line in logs.text.splitlines()]
    assert lines == [
        "[learner 1] [dlaas] the pod log of its fetch container:",
        f"[learner 1] {reason}",
    ]


def test_between_full_passes_the_monitor_reconciles_only_what_changed(
    client: TestClient,
    platform: Platform,
    settings: Settings,
    core: client.CoreV1Api,
    monkeypatch: pytest.MonkeyPatch,
    k8s_backend: tuple[Outbox, KubernetesBackend],
) -> None:
    """The pod watch says which trainings changed: a pass between two full ones observes
    those, and those written since the last pass (a stop request), not every training; a
    full pass (every DLAAS_MONITOR_FULL_PASS_SECONDS) observes them all again."""
    monkeypatch.setattr(monitor_module, "TOUCHED_MARGIN", timedelta(0))  # one clock here
    outbox, backend = k8s_backend
    headers = create_tenant(client, "acme")
    ids = []
    for i in range(3):
        r = submit(client, headers, json.dumps(base(name=f"t{i}")))
        assert r.status_code == 201, r.text
        ids.append(r.json()["id"])
    monitor = Monitor(platform, backend)
    monitor.tick()  # the first pass is a full one: all three admitted
    for tid in ids:
        execution.launch(platform, backend, tid)
        kubelet(core, f"{learner_name_prefix(tid)}-1", "Running", ended(0), RUN, RUN)
    until(lambda: all(backend.observe(t).learners[0].phase == "RUNNING" for t in ids))  # type: ignore[union-attr]

    observed: list[str] = []
    observe = backend.observe

    def counted(training_id: str) -> Any:
        observed.append(training_id)
        return observe(training_id)

    monkeypatch.setattr(backend, "observe", counted)
    monitor.tick()  # every training's pods changed
    assert sorted(observed) == sorted(ids)
    statuses = [client.get(f"/v1/trainings/{t}", headers=headers).json() for t in ids]
    assert [s["status"] for s in statuses] == ["RUNNING"] * 3
    monitor.tick()  # what the last pass wrote (the transitions) is read once more

    # Nothing changed, nothing written: a pass observes nothing.
    observed.clear()
    monitor.tick()
    assert observed == []

    # The second training's learner ends: the next pass observes that one alone.
    done = ids[1]
    kubelet(core, f"{learner_name_prefix(done)}-1", "Succeeded", ended(0), ended(0), ended(0))
    until(lambda: observe(done).learners[0].phase == "COMPLETED")  # type: ignore[union-attr]
    monitor.tick()
    assert observed == [done]
    assert client.get(f"/v1/trainings/{done}", headers=headers).json()["status"] == "COMPLETED"

    # A stop request (written by the API) is read by the next pass, with no pod change.
    observed.clear()
    stopped = ids[2]
    assert client.post(f"/v1/trainings/{stopped}/stop", headers=headers).status_code == 202
    monitor.tick()
    assert observed == [stopped]
    assert (STOP, stopped) in outbox.sent

    # The full pass observes every active training again.
    observed.clear()
    monitor.tick(utcnow() + timedelta(seconds=settings.monitor_full_pass_seconds))
    assert sorted(observed) == sorted([ids[0], stopped])


FFDL_TF_DISTRIBUTED = """\
name: Distributed-tensorflow-mnist
version: "1.0"
gpus: 0
memory: 1GiB
cpus: 1
learners: 2
framework:
  name: tensorflow
  version: "1.5.0-py3"
  command: PS_HOSTS_COUNT=1 ./launcher.py python3 mnist_dist.py --data_dir ${DATA_DIR}
"""


def test_an_ffdl_manifest_creates_pods_named_as_ffdl_names_them(
    client: TestClient,
    platform: Platform,
    core: client.CoreV1Api,
    k8s_backend: tuple[Outbox, KubernetesBackend],
) -> None:
    """FfDL's conventions on the cluster: learner i's pod and host `<prefix>-<i-1>` (from 0)
    in the headless Service `<prefix>`, so the launcher's `<prefix>-0.<prefix>:2222` is the
    parameter server (LEARNER_ID 1) and `<prefix>-1.<prefix>:2222` the worker."""
    outbox, backend = k8s_backend
    headers = create_tenant(client, "ffdl-user")
    r = submit(client, headers, FFDL_TF_DISTRIBUTED)
    assert r.status_code == 201, r.text
    tid = r.json()["id"]
    Monitor(platform, backend).tick()
    assert outbox.sent == [(LAUNCH, tid)]
    execution.launch(platform, backend, tid)

    prefix = learner_name_prefix(tid)
    pods = {p.metadata.name: p for p in core.list_namespaced_pod(NAMESPACE).items}
    assert sorted(pods) == [f"{prefix}-0", f"{prefix}-1"]
    for name, pod in pods.items():
        assert pod.spec.hostname == name and pod.spec.subdomain == prefix
        env = {e.name: e.value for e in pod.spec.containers[0].env}
        learner_id = int(name.rsplit("-", 1)[1]) + 1
        assert env["LEARNER_ID"] == pod.metadata.labels["dlaas.io/learner-id"] == str(learner_id)
        assert env["LEARNER_NAME_PREFIX"] == prefix
        assert env["NUM_LEARNERS"] == "2" and env["PS_HOSTS_COUNT"] == "1"
        assert env["JOB_STATE_DIR"] == "/job" and env["DLAAS_JOB_ID"] == tid
    assert pods[f"{prefix}-0"].metadata.labels["dlaas.io/role"] == "ps"
    assert pods[f"{prefix}-1"].metadata.labels["dlaas.io/role"] == "worker"
    (service,) = core.list_namespaced_service(
        NAMESPACE, label_selector=f"dlaas.io/training-id={tid}"
    ).items
    assert service.metadata.name == prefix
