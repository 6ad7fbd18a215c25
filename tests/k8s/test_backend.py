"""KubernetesBackend through the official client against the emulated API server: the test
plays the kubelet (pod phases and container states, through the status subresource) and
checks what the backend creates, what it observes from its watch, stop, cleanup, and that a
new backend on the same cluster reconciles from the labels without creating anything twice.
"""

from __future__ import annotations

import base64
import dataclasses
import json
import logging
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client, config
from kubernetes.client.rest import ApiException
from kubernetes.config import incluster_config

from service import runtimes
from service.domain.catalog import ComputeSpec
from service.domain.records import Secret
from service.logs import open_log_store
from service.logs.config import LogSinkConfig
from service.storage import keys, open_store
from service.storage.config import StoreConfig
from service.storage.local import LocalObjectStore
from tests.k8s.conftest import NAMESPACE
from tests.k8s.kubelet import RUN, WAIT, ended, kubelet
from tests.k8s_emulator import RunningApiserver
from tests.s3_server import ACCESS_KEY, SECRET_KEY, moto_server
from worker.backends.base import Observation, StartRequest
from worker.backends.kubernetes import pod_logs, pod_watch
from worker.backends.kubernetes.backend import KubernetesBackend, api_client
from worker.backends.kubernetes.objects import ClusterConfig
from worker.backends.kubernetes.observation import MISSING_POD_GRACE_SECONDS
from worker.launchers.plan import TrainingSpec, learner_name_prefix

CLUSTER = ClusterConfig(
    namespace=NAMESPACE,
    image_prefix="registry.example.com/dlaas/",
    image_tag="1.0",
    pull_secrets=(),
    gpu_resource="nvidia.com/gpu",
    cluster_domain="cluster.local",
)
TRAINING = "training-k8s1"
PREFIX = learner_name_prefix(TRAINING)
SELECTOR = f"dlaas.io/training-id={TRAINING}"
STORE_SECRET = "store-secret-not-in-any-pod-spec"
PULL_TIMEOUT = 60.0


def request(
    training_id: str = TRAINING,
    *,
    nodes: int = 2,
    framework: str = "tensorflow",
    attempt: int = 1,
    compute: ComputeSpec | None = None,
) -> StartRequest:
    mpi = framework in ("tensorflow-horovod", "pytorch-ddl")
    runtime = "pytorch2.13" if framework.startswith("pytorch") else "horovod-tf2.14"
    spec = TrainingSpec(
        training_id=training_id,
        framework=framework,
        version="2.21",
        command="python3 train.py",
        nodes=nodes,
        parameter_servers=0,
        distribution="mpi" if mpi else "torchrun" if framework == "pytorch" else "parameter_server",
        cpus=2,
        memory_gib=4,
    )
    return StartRequest(
        spec=spec,
        model_definition_key=f"trainings/{training_id}/model_definition.zip",
        store=StoreConfig(
            kind="s3",
            endpoint="http://minio.dlaas:9000",
            access_key=Secret("store-key"),
            secret_key=Secret(STORE_SECRET),
            bucket="dlaas",
        ),
        log_sink=LogSinkConfig(kind="redis", url="redis://redis.dlaas:6379/1"),
        results_prefix=f"trainings/{training_id}/results/",
        attempt=attempt,
        runtime=runtimes.in_learner_image(runtime) if mpi or runtime == "pytorch2.13" else None,
        tenant="acme",
        compute=compute,
        max_runtime=600,
    )


class Clock:
    """The backend's clock, moved on by the tests (image pull timeouts, pod TTL)."""

    def __init__(self) -> None:
        self.ahead = 0.0

    def __call__(self) -> float:
        return time.time() + self.ahead


@pytest.fixture
def clock() -> Clock:
    return Clock()


@pytest.fixture
def make_backend(
    k8s_api: client.ApiClient, clock: Clock
) -> Iterator[Callable[..., KubernetesBackend]]:
    made: list[KubernetesBackend] = []

    def make(**kwargs: Any) -> KubernetesBackend:
        backend = KubernetesBackend(
            k8s_api,
            CLUSTER,
            stop_grace_seconds=1,
            image_pull_timeout=PULL_TIMEOUT,
            clock=clock,
            **kwargs,
        )
        made.append(backend)
        return backend

    yield make
    for backend in made:
        backend.close()


@pytest.fixture
def backend(make_backend: Callable[..., KubernetesBackend]) -> KubernetesBackend:
    return make_backend()


def eventually(check: Callable[[], Any], timeout: float = 5.0) -> Any:
    """Wait until `check()` is truthy (the watch delivers asynchronously); return it."""
    deadline = time.monotonic() + timeout
    while True:
        value = check()
        if value or time.monotonic() > deadline:
            assert value, "the condition did not hold in time"
            return value
        time.sleep(0.02)


def phases(backend: KubernetesBackend, training_id: str = TRAINING) -> list[str]:
    observed = backend.observe(training_id)
    return [] if observed is None else [lo.phase for lo in observed.learners]


def learner_of(backend: KubernetesBackend, learner_id: int) -> Any:
    observed = backend.observe(TRAINING)
    assert observed is not None
    return next(lo for lo in observed.learners if lo.learner_id == learner_id)


def names(items: list[Any]) -> list[str]:
    return sorted(item.metadata.name for item in items)


# -- create ---------------------------------------------------------------------------------


def test_start_creates_the_owner_then_the_secret_and_one_pod_per_learner(
    backend: KubernetesBackend, core: client.CoreV1Api
) -> None:
    backend.start(request(compute=ComputeSpec(gpus=1, cpus=8, memory_gib=24)))

    (service,) = core.list_namespaced_service(NAMESPACE, label_selector=SELECTOR).items
    assert service.metadata.name == PREFIX
    assert service.spec.cluster_ip == "None"
    assert service.metadata.owner_references is None  # it is the owner
    assert service.metadata.labels == {
        "dlaas.io/training-id": TRAINING,
        "dlaas.io/tenant": "acme",
        "dlaas.io/attempt": "1",
    }
    owner_uid = service.metadata.uid

    (secret,) = core.list_namespaced_secret(NAMESPACE, label_selector=SELECTOR).items
    assert secret.metadata.owner_references[0].uid == owner_uid
    assert secret.metadata.owner_references[0].kind == "Service"
    spec_1 = json.loads(base64.b64decode(secret.data["learner-1.json"]))
    assert spec_1["store"]["secret_key"] == STORE_SECRET  # the credentials are here only
    assert spec_1["model_dir"] == "/job/model-code"
    assert (spec_1["upload_results"], spec_1["num_learners"]) == (True, 2)

    pods = core.list_namespaced_pod(NAMESPACE, label_selector=SELECTOR).items
    assert names(pods) == [f"{PREFIX}-1", f"{PREFIX}-2"]
    for pod in pods:
        lid = pod.metadata.name.rsplit("-", 1)[1]
        assert pod.metadata.labels["dlaas.io/learner-id"] == lid
        assert pod.metadata.labels["dlaas.io/tenant"] == "acme"
        assert pod.metadata.labels["dlaas.io/attempt"] == "1"
        assert [(r.kind, r.uid) for r in pod.metadata.owner_references] == [("Service", owner_uid)]
        assert (pod.spec.hostname, pod.spec.subdomain) == (pod.metadata.name, PREFIX)
        learner = pod.spec.containers[0]
        assert learner.image == "registry.example.com/dlaas/learner-platform:1.0"
        assert learner.resources.limits["nvidia.com/gpu"] == "1"
        env = {e.name: e.value for e in learner.env}
        assert (env["LEARNER_ID"], env["NUM_LEARNERS"]) == (lid, "2")
        assert STORE_SECRET not in json.dumps(client.ApiClient().sanitize_for_serialization(pod))
        assert pod.spec.active_deadline_seconds >= 600

    observed = backend.observe(TRAINING)
    assert observed is not None
    assert [(lo.learner_id, lo.phase) for lo in observed.learners] == [
        (1, "PENDING"),
        (2, "PENDING"),
    ]
    assert (observed.primaries, observed.attempt) == ((1, 2), 1)  # every worker stores
    assert backend.held() == [TRAINING]


def test_a_second_start_creates_nothing(backend: KubernetesBackend, core: client.CoreV1Api) -> None:
    backend.start(request())
    before = {p.metadata.name: p.metadata.uid for p in core.list_namespaced_pod(NAMESPACE).items}
    backend.start(request())
    after = {p.metadata.name: p.metadata.uid for p in core.list_namespaced_pod(NAMESPACE).items}
    assert after == before
    assert len(core.list_namespaced_service(NAMESPACE).items) == 1
    assert len(core.list_namespaced_secret(NAMESPACE).items) == 1


def test_an_mpi_training_gets_its_key_pair_hostfile_and_runtime_image(
    backend: KubernetesBackend, core: client.CoreV1Api
) -> None:
    backend.start(request(framework="tensorflow-horovod"))
    (secret,) = core.list_namespaced_secret(NAMESPACE, label_selector=SELECTOR).items
    assert {"id_ed25519", "id_ed25519.pub", "authorized_keys", "hostfile"} <= set(secret.data)
    private = base64.b64decode(secret.data["id_ed25519"]).decode()
    assert private.startswith("-----BEGIN OPENSSH PRIVATE KEY-----")
    hostfile = base64.b64decode(secret.data["hostfile"]).decode()
    assert f"{PREFIX}-1" in hostfile and f"{PREFIX}-2" in hostfile
    pods = {p.metadata.name: p for p in core.list_namespaced_pod(NAMESPACE).items}
    launcher = pods[f"{PREFIX}-1"].spec.containers[0]
    assert launcher.image == "registry.example.com/dlaas/learner-horovod-tf2.14:1.0"
    assert "mpirun" in launcher.command
    assert pods[f"{PREFIX}-1"].metadata.labels["dlaas.io/role"] == "mpi-launcher"
    assert pods[f"{PREFIX}-2"].metadata.labels["dlaas.io/role"] == "mpi-host"


def test_a_failed_start_leaves_nothing(
    backend: KubernetesBackend, core: client.CoreV1Api, monkeypatch: pytest.MonkeyPatch
) -> None:
    real = backend.core.create_namespaced_pod
    calls = []

    def second_fails(namespace: str, body: Any, **kwargs: Any) -> Any:
        calls.append(body["metadata"]["name"])
        if len(calls) == 2:
            raise ApiException(status=403, reason="Forbidden: exceeded quota")
        return real(namespace, body, **kwargs)

    monkeypatch.setattr(backend.core, "create_namespaced_pod", second_fails)
    with pytest.raises(ApiException):
        backend.start(request())
    assert core.list_namespaced_pod(NAMESPACE).items == []
    assert core.list_namespaced_secret(NAMESPACE).items == []
    assert core.list_namespaced_service(NAMESPACE).items == []
    eventually(lambda: backend.observe(TRAINING) is None)


# -- the watch --------------------------------------------------------------------------


def test_pod_states_become_learner_states_through_the_watch(
    backend: KubernetesBackend, core: client.CoreV1Api
) -> None:
    woken = threading.Event()
    with backend.changes(woken.set):
        backend.start(request())
        woken.clear()
        kubelet(core, f"{PREFIX}-1", "Pending", RUN, WAIT, WAIT)
        assert woken.wait(5)
        eventually(lambda: phases(backend) == ["DOWNLOADING", "PENDING"])
        kubelet(core, f"{PREFIX}-1", "Running", ended(0), RUN, RUN)
        kubelet(core, f"{PREFIX}-2", "Running", ended(0), RUN, RUN)
        eventually(lambda: phases(backend) == ["RUNNING", "RUNNING"])
        kubelet(core, f"{PREFIX}-1", "Running", ended(0), RUN, ended(0))
        eventually(lambda: phases(backend) == ["STORING", "RUNNING"])
        kubelet(core, f"{PREFIX}-1", "Succeeded", ended(0), ended(0), ended(0))
        kubelet(core, f"{PREFIX}-2", "Failed", ended(0), ended(0), ended(3, "Error"))
        eventually(lambda: phases(backend) == ["COMPLETED", "FAILED"])
    one, two = backend.observe(TRAINING).learners  # type: ignore[union-attr]
    assert one.exit_code == 0
    assert (two.exit_code, two.message) == (3, "learner 2 exited with code 3")


def test_an_image_that_cannot_be_pulled_fails_the_learner_past_the_timeout(
    backend: KubernetesBackend, core: client.CoreV1Api, clock: Clock
) -> None:
    backend.start(request(nodes=1))
    image = "registry.example.com/dlaas/learner-platform:1.0"
    pulling = {"waiting": {"reason": "ImagePullBackOff", "message": "Back-off pulling image"}}
    kubelet(core, f"{PREFIX}-1", "Pending", ended(0), RUN, pulling, image=image)
    eventually(
        lambda: learner_of(backend, 1).message and "pulling" in learner_of(backend, 1).message
    )
    assert learner_of(backend, 1).phase == "PENDING"
    clock.ahead = PULL_TIMEOUT + 5
    failed = learner_of(backend, 1)
    assert failed.phase == "FAILED"
    assert f"could not pull image {image} (ImagePullBackOff)" in failed.message


def test_an_unschedulable_learner_stays_pending_with_the_schedulers_message(
    backend: KubernetesBackend, core: client.CoreV1Api
) -> None:
    backend.start(request(nodes=1))
    why = "0/3 nodes are available: 3 Insufficient nvidia.com/gpu."
    core.patch_namespaced_pod_status(
        f"{PREFIX}-1",
        NAMESPACE,
        {
            "status": {
                "phase": "Pending",
                "conditions": [
                    {
                        "type": "PodScheduled",
                        "status": "False",
                        "reason": "Unschedulable",
                        "message": why,
                    }
                ],
            }
        },
    )
    eventually(lambda: learner_of(backend, 1).message == f"unschedulable: {why}")
    assert learner_of(backend, 1).phase == "PENDING"


def test_out_of_memory_fails_the_learner_saying_so(
    backend: KubernetesBackend, core: client.CoreV1Api
) -> None:
    backend.start(request(nodes=1))
    kubelet(core, f"{PREFIX}-1", "Failed", ended(0), RUN, ended(137, "OOMKilled"))
    eventually(lambda: phases(backend) == ["FAILED"])
    oom = learner_of(backend, 1)
    assert (oom.exit_code, oom.message) == (137, "learner 1 was killed: out of memory (OOMKilled)")


def test_a_deleted_pod_is_a_lost_learner(
    backend: KubernetesBackend, core: client.CoreV1Api
) -> None:
    backend.start(request())
    kubelet(core, f"{PREFIX}-1", "Running", ended(0), RUN, RUN)
    kubelet(core, f"{PREFIX}-2", "Running", ended(0), RUN, RUN)
    eventually(lambda: phases(backend) == ["RUNNING", "RUNNING"])
    core.delete_namespaced_pod(f"{PREFIX}-2", NAMESPACE)
    eventually(lambda: phases(backend) == ["RUNNING", "LOST"])
    assert learner_of(backend, 2).message == "learner 2's pod was deleted"


def test_the_watch_lists_again_when_its_version_is_gone(
    backend: KubernetesBackend,
    core: client.CoreV1Api,
    k8s_apiserver: RunningApiserver,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(pod_watch, "WATCH_SECONDS", 1)
    backend.start(request(nodes=1))
    assert backend.watch.lists == 1
    # Changes the watch does not see (no training label), then the history forgotten: the
    # watch's next resume is from a version the server no longer has (410 Gone).
    core.create_namespaced_pod(
        NAMESPACE,
        {"metadata": {"name": "other"}, "spec": {"containers": [{"name": "c", "image": "x"}]}},
    )
    k8s_apiserver.compact()
    eventually(lambda: backend.watch.lists >= 2, timeout=10)
    kubelet(core, f"{PREFIX}-1", "Running", ended(0), RUN, RUN)
    eventually(lambda: phases(backend) == ["RUNNING"])


def test_changed_names_the_trainings_whose_pods_changed_since_it_was_last_asked(
    backend: KubernetesBackend,
    core: client.CoreV1Api,
    k8s_apiserver: RunningApiserver,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """What lets the monitor reconcile only what changed between its full passes; None
    (reconcile everything) whenever the watch may have missed something."""
    monkeypatch.setattr(pod_watch, "WATCH_SECONDS", 1)
    assert backend.changed() is None  # no watch yet
    backend.start(request(nodes=1))
    assert backend.changed() is None  # the first list: anything may have changed before
    kubelet(core, f"{PREFIX}-1", "Running", ended(0), RUN, RUN)
    assert eventually(backend.changed) == {TRAINING}
    assert backend.changed() == set()  # asked again: nothing new

    # A pod of a training this backend never started nor observed: it cannot say whose.
    core.create_namespaced_pod(
        NAMESPACE,
        {
            "metadata": {"name": "foreign", "labels": {"dlaas.io/training-id": "foreign"}},
            "spec": {"containers": [{"name": "c", "image": "x"}]},
        },
    )
    eventually(lambda: backend.watch.pods("foreign"))
    assert backend.changed() is None
    backend.observe("foreign")
    core.patch_namespaced_pod_status("foreign", NAMESPACE, {"status": {"phase": "Running"}})
    assert eventually(backend.changed) == {"foreign"}

    # After a list (the watch's version expired), anything may have changed unseen.
    core.create_namespaced_pod(
        NAMESPACE,
        {"metadata": {"name": "other"}, "spec": {"containers": [{"name": "c", "image": "x"}]}},
    )
    k8s_apiserver.compact()
    eventually(lambda: backend.watch.lists >= 2, timeout=10)
    assert backend.changed() is None


# -- stop, cleanup, restart ------------------------------------------------------------------


def test_stop_deletes_the_pods_and_returns_once_they_are_gone(
    backend: KubernetesBackend, core: client.CoreV1Api
) -> None:
    backend.start(request())
    kubelet(core, f"{PREFIX}-1", "Succeeded", ended(0), ended(0), ended(0))
    kubelet(core, f"{PREFIX}-2", "Running", ended(0), RUN, RUN)
    eventually(lambda: phases(backend) == ["COMPLETED", "RUNNING"])
    backend.stop(TRAINING)
    # The pod still running is gone; the one that ended holds no process and stays (for
    # cleanup, and the TTL).
    left = core.list_namespaced_pod(NAMESPACE, label_selector=SELECTOR).items
    assert names(left) == [f"{PREFIX}-1"]
    assert phases(backend) == ["COMPLETED", "LOST"]
    assert backend.held() == [TRAINING]  # stopped, not cleaned up
    backend.cleanup(TRAINING)
    assert core.list_namespaced_pod(NAMESPACE, label_selector=SELECTOR).items == []


def test_cleanup_deletes_every_object_of_the_training(
    backend: KubernetesBackend, core: client.CoreV1Api
) -> None:
    backend.start(request())
    backend.start(request("training-other", nodes=1))
    backend.cleanup(TRAINING)
    for lister in (
        core.list_namespaced_pod,
        core.list_namespaced_secret,
        core.list_namespaced_service,
    ):
        assert lister(NAMESPACE, label_selector=SELECTOR).items == []
        assert len(lister(NAMESPACE, label_selector="dlaas.io/training-id").items) >= 1
    assert backend.observe(TRAINING) is None
    assert backend.held() == ["training-other"]
    time.sleep(0.3)  # late events of the deletion bring nothing back
    assert backend.observe(TRAINING) is None


def test_pods_of_an_ended_training_are_kept_for_the_ttl(
    make_backend: Callable[..., KubernetesBackend], core: client.CoreV1Api, clock: Clock
) -> None:
    backend = make_backend(pod_ttl_seconds=600)
    backend.start(request(nodes=1))
    kubelet(core, f"{PREFIX}-1", "Failed", ended(0), ended(0), ended(2, "Error"))
    eventually(lambda: phases(backend) == ["FAILED"])
    backend.stop(TRAINING)  # as FINALIZE does: nothing to stop in a pod that ended
    backend.cleanup(TRAINING)
    # The credentials go at once; the pod and its Service stay for debugging.
    assert core.list_namespaced_secret(NAMESPACE, label_selector=SELECTOR).items == []
    assert len(core.list_namespaced_pod(NAMESPACE, label_selector=SELECTOR).items) == 1
    assert backend.held() == [TRAINING]  # the monitor finalizes it again later
    clock.ahead = 601
    backend.cleanup(TRAINING)
    assert core.list_namespaced_pod(NAMESPACE, label_selector=SELECTOR).items == []
    assert core.list_namespaced_service(NAMESPACE, label_selector=SELECTOR).items == []


def test_a_new_backend_reconciles_from_the_cluster_and_creates_nothing_twice(
    make_backend: Callable[..., KubernetesBackend], core: client.CoreV1Api
) -> None:
    first = make_backend()
    first.start(request())
    kubelet(core, f"{PREFIX}-1", "Running", ended(0), RUN, RUN)
    eventually(lambda: phases(first) == ["RUNNING", "PENDING"])
    uids = {p.metadata.name: p.metadata.uid for p in core.list_namespaced_pod(NAMESPACE).items}
    first.close()

    restarted = make_backend()  # a restarted worker or monitor
    assert restarted.held() == [TRAINING]
    observed = restarted.observe(TRAINING)
    assert isinstance(observed, Observation)
    assert [lo.phase for lo in observed.learners] == ["RUNNING", "PENDING"]
    assert (observed.primaries, observed.attempt) == ((1, 2), 1)
    restarted.start(request())  # a launch delivered again
    again = {p.metadata.name: p.metadata.uid for p in core.list_namespaced_pod(NAMESPACE).items}
    assert again == uids


def test_a_pod_deleted_while_no_backend_watched_is_lost_after_a_restart(
    make_backend: Callable[..., KubernetesBackend], core: client.CoreV1Api, clock: Clock
) -> None:
    first = make_backend()
    first.start(request())
    first.close()
    core.delete_namespaced_pod(f"{PREFIX}-2", NAMESPACE)
    restarted = make_backend()
    # Soon after the others were created, it may still be on its way (a start under way).
    assert phases(restarted) == ["PENDING", "PENDING"]
    clock.ahead = MISSING_POD_GRACE_SECONDS + 1
    assert phases(restarted) == ["PENDING", "LOST"]
    assert learner_of(restarted, 2).message == "learner 2's pod was deleted"


def test_a_learner_whose_pod_is_not_created_yet_is_pending(
    backend: KubernetesBackend, core: client.CoreV1Api, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Another process's backend sees the pods of a start one by one."""
    real = backend.core.create_namespaced_pod
    seen: list[list[str]] = []

    def observed_between(namespace: str, body: Any, **kwargs: Any) -> Any:
        if body["metadata"]["name"].endswith("-2"):
            eventually(lambda: phases(backend) == ["PENDING", "PENDING"])
            seen.append([str(lo.message) for lo in backend.observe(TRAINING).learners])  # type: ignore[union-attr]
        return real(namespace, body, **kwargs)

    monkeypatch.setattr(backend.core, "create_namespaced_pod", observed_between)
    backend.start(request())
    assert seen == [["None", "learner 2's pod is being created"]]


def test_a_new_attempt_replaces_what_is_left_of_the_last(
    make_backend: Callable[..., KubernetesBackend], core: client.CoreV1Api
) -> None:
    backend = make_backend(pod_ttl_seconds=600)
    backend.start(request())
    kubelet(core, f"{PREFIX}-2", "Failed", ended(0), ended(0), ended(1, "Error"))
    old = {p.metadata.uid for p in core.list_namespaced_pod(NAMESPACE).items}
    backend.start(request(attempt=2))
    pods = core.list_namespaced_pod(NAMESPACE, label_selector=SELECTOR).items
    assert names(pods) == [f"{PREFIX}-1", f"{PREFIX}-2"]
    assert {p.metadata.uid for p in pods}.isdisjoint(old)
    assert {p.metadata.labels["dlaas.io/attempt"] for p in pods} == {"2"}
    eventually(lambda: (o := backend.observe(TRAINING)) and o.attempt == 2)
    assert phases(backend) == ["PENDING", "PENDING"]


def test_save_checkpoints_counts_what_the_agents_saved(
    backend: KubernetesBackend, core: client.CoreV1Api, tmp_path: Path
) -> None:
    store = LocalObjectStore(tmp_path / "store")
    attempt = keys.attempt_checkpoints_prefix(TRAINING, 1)
    # Nothing held for the training: nothing to say about it.
    assert backend.save_checkpoints(TRAINING, store, attempt) is None
    backend.start(request())
    (secret,) = core.list_namespaced_secret(NAMESPACE, label_selector=SELECTOR).items
    specs = [json.loads(base64.b64decode(secret.data[f"learner-{i}.json"])) for i in (1, 2)]
    assert [(s["checkpoints_prefix"], s["restore_checkpoints"]) for s in specs] == [
        (f"{attempt}learner-1/", None),
        (f"{attempt}learner-2/", None),
    ]
    # No agent saved anything (pods that never ran): None, the older attempt's are kept.
    assert backend.save_checkpoints(TRAINING, store, attempt) is None
    for i, size in ((1, 10), (2, 5)):
        (tmp_path / "f").write_bytes(b"x" * size)
        store.put_file(f"{attempt}learner-{i}/ckpt", tmp_path / "f")
    assert backend.save_checkpoints(TRAINING, store, attempt) == 15


# -- the pod log fallback --------------------------------------------------------------------


def set_pod_log(apiserver: RunningApiserver, pod: str, container: str, text: str) -> None:
    apiserver.emulator.pod_logs[(NAMESPACE, pod, container)] = text


def test_the_pod_log_of_a_learner_whose_agent_never_ran_is_appended_to_its_log(
    make_backend: Callable[..., KubernetesBackend],
    core: client.CoreV1Api,
    k8s_apiserver: RunningApiserver,
    tmp_path: Path,
) -> None:
    logs = open_log_store("file", dir=str(tmp_path / "logs"))
    backend = make_backend(log_store=logs, pod_ttl_seconds=600)
    backend.start(request())
    # Learner 1's fetch failed: its agent and command never ran. Learner 2's agent ran
    # (and sent its output itself): its pod log is not read.
    set_pod_log(
        k8s_apiserver,
        f"{PREFIX}-1",
        "fetch",
        "learner wrapper: the code archive could not be downloaded\n\x1b[31mred\x07\n",
    )
    set_pod_log(k8s_apiserver, f"{PREFIX}-2", "learner", "sent by the agent already\n")
    kubelet(core, f"{PREFIX}-1", "Failed", ended(2, "Error"), WAIT, WAIT)
    kubelet(core, f"{PREFIX}-2", "Failed", ended(0), ended(0), ended(1, "Error"))
    eventually(lambda: phases(backend) == ["FAILED", "FAILED"])
    backend.stop(TRAINING)
    backend.cleanup(TRAINING)  # kept for the TTL: cleaned up again later
    backend.cleanup(TRAINING)
    records, _ = logs.read(TRAINING)
    assert [(r.learner, r.line) for r in records] == [
        (1, "[dlaas] the pod log of its fetch container:"),
        (1, "learner wrapper: the code archive could not be downloaded"),
        (1, "[31mred"),  # untrusted text: control characters dropped
    ]


def test_the_pod_log_fallback_is_capped(
    backend: KubernetesBackend,
    core: client.CoreV1Api,
    k8s_apiserver: RunningApiserver,
    tmp_path: Path,
) -> None:
    backend.pod_log_fallback.log_store = logs = open_log_store("file", dir=str(tmp_path / "logs"))
    backend.start(request(nodes=1))
    # The agent could not work (no log store to send to): fetch's and the command's logs.
    set_pod_log(k8s_apiserver, f"{PREFIX}-1", "fetch", "fetched\n")
    big = "".join(f"line {i:06d} {'x' * 90}\n" for i in range(2000))  # 200 KB
    set_pod_log(k8s_apiserver, f"{PREFIX}-1", "learner", big)
    kubelet(core, f"{PREFIX}-1", "Failed", ended(0), ended(2, "Error"), ended(1, "Error"))
    eventually(lambda: phases(backend) == ["FAILED"])
    backend.cleanup(TRAINING)
    lines = [r.line for r in logs.read(TRAINING, limit=100_000)[0]]
    assert lines[:3] == [
        "[dlaas] the pod log of its fetch container:",
        "fetched",
        "[dlaas] the pod log of its learner container:",
    ]
    assert lines[3] == f"line 000000 {'x' * 90}"
    assert lines[-1] == f"[dlaas] the pod log was cut at {pod_logs.POD_LOG_BYTES} bytes"
    # Exactly the cap: every byte of fetch's log, the learner's up to it (its last line cut).
    kept = "\n".join(lines[1:2]) + "\n" + "\n".join(lines[3:-1])
    assert len(kept.encode()) == pod_logs.POD_LOG_BYTES


# -- configuration ---------------------------------------------------------------------------


def test_in_a_pod_the_client_uses_the_service_account(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """KUBERNETES_SERVICE_HOST set: the in-cluster configuration, not KUBECONFIG."""
    token, ca = tmp_path / "token", tmp_path / "ca.crt"
    token.write_text("service-account-token")
    ca.write_text("-----BEGIN CERTIFICATE-----\n")
    monkeypatch.setattr(incluster_config, "SERVICE_TOKEN_FILENAME", str(token))
    monkeypatch.setattr(incluster_config, "SERVICE_CERT_FILENAME", str(ca))
    monkeypatch.setenv("KUBERNETES_SERVICE_HOST", "10.96.0.1")
    monkeypatch.setenv("KUBERNETES_SERVICE_PORT", "443")
    monkeypatch.setenv("KUBECONFIG", str(tmp_path / "absent"))
    api = api_client()
    try:
        assert api.configuration.host == "https://10.96.0.1:443"
        assert api.configuration.ssl_ca_cert == str(ca)
    finally:
        api.close()


def test_elsewhere_the_client_reads_kubeconfig(
    k8s_apiserver: RunningApiserver, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
    monkeypatch.setenv("KUBECONFIG", str(k8s_apiserver.kubeconfig))
    api = api_client()
    try:
        assert api.configuration.host == k8s_apiserver.url
    finally:
        api.close()


# -- RBAC ------------------------------------------------------------------------------------


def _verbs_used(api: client.ApiClient) -> set[tuple[str, str]]:
    """Record (resource, verb) of every request made through `api`, as RBAC names them."""
    used: set[tuple[str, str]] = set()
    call = api.call_api

    def recorded(resource_path: str, method: str, *args: Any, **kwargs: Any) -> Any:
        # /api/v1 or /apis/<group>/<version>, then /namespaces/{namespace}/<resource>[/{name}[/sub]]
        parts = resource_path.split("/")
        at = parts.index("{namespace}") + 1
        resource = parts[at]
        named = len(parts) > at + 1
        if len(parts) > at + 2:
            resource += "/" + parts[at + 2]
        query = dict(args[1] or []) if len(args) > 1 else dict(kwargs.get("query_params") or [])
        verb = {
            "POST": "create",
            "PUT": "update",
            "PATCH": "patch",
            "DELETE": "delete" if named else "deletecollection",
        }.get(method, "get" if named else ("watch" if query.get("watch") else "list"))
        used.add((resource, verb))
        return call(resource_path, method, *args, **kwargs)

    api.call_api = recorded
    return used


def test_the_backend_uses_only_what_the_charts_role_allows(
    k8s_apiserver: RunningApiserver, core: client.CoreV1Api, tmp_path: Path
) -> None:
    from tests.deploy.test_chart import EXPECTED_RULES

    allowed = {(r, v) for rule in EXPECTED_RULES for r in rule["resources"] for v in rule["verbs"]}
    api = config.new_client_from_config(config_file=str(k8s_apiserver.kubeconfig))
    used = _verbs_used(api)
    logs = open_log_store("file", dir=str(tmp_path / "logs"))
    backend = KubernetesBackend(
        api, CLUSTER, stop_grace_seconds=1, pod_ttl_seconds=60, log_store=logs
    )
    try:
        backend.start(request(framework="tensorflow-horovod"))
        backend.start(request(framework="tensorflow-horovod"))
        # Learner 1's fetch fails (the kubelet's client is not the backend's): its pod log
        # is read at the stop.
        set_pod_log(k8s_apiserver, f"{PREFIX}-1", "fetch", "no code\n")
        kubelet(core, f"{PREFIX}-1", "Failed", ended(2, "Error"), WAIT, WAIT)
        eventually(lambda: phases(backend)[0] == "FAILED")
        backend.observe(TRAINING)
        backend.held()
        backend.stop(TRAINING)
        backend.cleanup(TRAINING)
        backend.start(request(framework="tensorflow-horovod", attempt=2))
        backend.stop(TRAINING)
        backend.cleanup(TRAINING)
    finally:
        backend.close()
        api.close()
    assert used == allowed, (sorted(used - allowed), sorted(allowed - used))
    assert {("networkpolicies", "create"), ("networkpolicies", "delete")} <= used


def test_a_start_under_way_already_names_a_primary_learner(
    backend: KubernetesBackend, core: client.CoreV1Api, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A parameter server is no primary: were its pod created first, a monitor observing
    the start between two creations would read a report naming no primary (malformed)."""
    real = backend.core.create_namespaced_pod
    primaries: list[tuple[int, ...]] = []

    def observed_before(namespace: str, body: Any, **kwargs: Any) -> Any:
        if (observed := backend.observe(TRAINING)) is not None:
            primaries.append(observed.primaries)
        return real(namespace, body, **kwargs)

    monkeypatch.setattr(backend.core, "create_namespaced_pod", observed_before)
    three = request(nodes=3)
    backend.start(
        dataclasses.replace(three, spec=dataclasses.replace(three.spec, parameter_servers=1))
    )
    assert len(primaries) == 2 and all(primaries), primaries
    observed = backend.observe(TRAINING)
    assert observed is not None and observed.primaries == (2, 3)


# -- the store credentials in the Secret ------------------------------------------------------


def _specs(core: client.CoreV1Api) -> list[dict[str, Any]]:
    (secret,) = core.list_namespaced_secret(NAMESPACE, label_selector=SELECTOR).items
    return [
        json.loads(base64.b64decode(value))
        for name, value in sorted(secret.data.items())
        if name.startswith("learner-")
    ]


def test_with_a_role_the_secret_holds_temporary_credentials_scoped_to_the_training(
    make_backend: Callable[..., KubernetesBackend], core: client.CoreV1Api
) -> None:
    """DLAAS_STORE_ROLE_ARN set: each learner's spec carries credentials assumed from the
    role at the store's endpoint (moto's STS here), never the platform's; they open the
    store and read the training's model definition."""
    role = "arn:aws:iam::123456789012:role/dlaas-learners"
    with moto_server() as s3:
        model_key = keys.model_definition_key(TRAINING, "zip")
        s3.make_bucket("dlaas", {model_key: b"code"})
        platform = StoreConfig(
            kind="s3",
            endpoint=s3.url,
            access_key=Secret(ACCESS_KEY),
            secret_key=Secret(SECRET_KEY),
            bucket="dlaas",
        )
        backend = make_backend(store_role_arn=role)
        backend.start(dataclasses.replace(request(), store=platform))

        specs = _specs(core)
        assert len(specs) == 2
        for spec in specs:
            store = spec["store"]
            assert store["access_key"] not in (None, ACCESS_KEY)
            assert store["secret_key"] not in (None, SECRET_KEY)
            assert store["session_token"]
            assert (store["endpoint"], store["bucket"]) == (s3.url, "dlaas")
        assert specs[0]["store"] == specs[1]["store"]  # one session per training
        scoped = StoreConfig.from_dict(specs[0]["store"])
        with open_store(scoped).open(model_key) as f:
            assert f.read() == b"code"
        for pod in core.list_namespaced_pod(NAMESPACE, label_selector=SELECTOR).items:
            serialized = json.dumps(client.ApiClient().sanitize_for_serialization(pod))
            assert specs[0]["store"]["secret_key"] not in serialized
            assert specs[0]["store"]["session_token"] not in serialized


def test_a_role_that_cannot_be_assumed_fails_the_start_and_creates_nothing(
    make_backend: Callable[..., KubernetesBackend], core: client.CoreV1Api
) -> None:
    backend = make_backend(store_role_arn="not-an-arn")
    with pytest.raises(Exception, match="RoleArn"):
        backend.start(request())
    assert core.list_namespaced_service(NAMESPACE).items == []
    assert core.list_namespaced_secret(NAMESPACE).items == []
    assert core.list_namespaced_pod(NAMESPACE).items == []


def test_without_a_role_the_platform_s_credentials_go_unscoped_said_once(
    backend: KubernetesBackend, core: client.CoreV1Api, caplog: pytest.LogCaptureFixture
) -> None:
    with caplog.at_level(logging.WARNING, logger="worker.backends.kubernetes.backend"):
        backend.start(request())
        backend.start(request("training-k8s2"))
    said = [r.getMessage() for r in caplog.records if "not scoped" in r.getMessage()]
    assert said == [
        "learner pods get the platform's store credentials, not scoped to their training "
        "(DLAAS_STORE_ROLE_ARN is not set): a learner's pod can read and write the whole store"
    ]
    for spec in _specs(core):
        assert spec["store"]["secret_key"] == STORE_SECRET
        assert spec["store"]["session_token"] is None
