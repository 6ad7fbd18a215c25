"""`dlaas up` against a cluster: a subprocess with DLAAS_BACKEND=kubernetes and KUBECONFIG
naming the emulated API server this test runs (tests/k8s_emulator.py; no cluster can run
here), its object store on S3 (moto) and its live logs on Redis, as pods need them.

A training submitted through the REST API becomes its objects in the cluster (headless
Service, Secret, one labelled pod per learner); the test plays the kubelet and the API
follows the pods to COMPLETED. Ctrl-C halts a running training and deletes its pods: a
`dlaas up` that stops leaves nothing running in the cluster that nobody watches. The
real-cluster suite (tests/k8s_cluster) runs here too, against the emulator, so its harness
is exercised where no cluster is."""

from __future__ import annotations

import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from functools import partial
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client, config
from sqlalchemy import text

from dlaas import Client
from service.db.session import make_engine
from service.domain.names import label_value
from tests.e2e.test_up import DLAAS, ENV_CODE, ROOT, Up, clean_env, start_up, wait_status
from tests.k8s.conftest import NAMESPACE
from tests.k8s.kubelet import RUN, ended, kubelet
from tests.k8s_cluster.examples import numbered_examples
from tests.k8s_emulator import RunningApiserver, running_apiserver
from tests.s3_server import ACCESS_KEY, SECRET_KEY, S3Server, moto_server
from worker.launchers.plan import learner_name_prefix

pytestmark = pytest.mark.e2e

# The shared Redis (never flushed here): live log lines keyed by training id.
LOG_STORE = "redis://127.0.0.1:6379/3"
IMAGE_PREFIX = "registry.example.com/dlaas/"
SELECTOR = "dlaas.io/training-id"


@pytest.fixture
def apiserver(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[RunningApiserver]:
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)  # KUBECONFIG, not a pod's
    with running_apiserver(tmp_path) as server:
        yield server


@pytest.fixture
def core(apiserver: RunningApiserver) -> Iterator[client.CoreV1Api]:
    api = config.new_client_from_config(config_file=str(apiserver.kubeconfig))
    try:
        yield client.CoreV1Api(api)
    finally:
        api.close()


@pytest.fixture
def s3() -> Iterator[S3Server]:
    with moto_server() as server:
        yield server


def store_settings(s3: S3Server) -> dict[str, str]:
    """The kubernetes backend with stores the pods reach: S3 and Redis."""
    return {
        "DLAAS_BACKEND": "kubernetes",
        "DLAAS_K8S_NAMESPACE": NAMESPACE,
        "DLAAS_S3_ENDPOINT": s3.url,
        "DLAAS_S3_ACCESS_KEY": ACCESS_KEY,
        "DLAAS_S3_SECRET_KEY": SECRET_KEY,
        "DLAAS_S3_BUCKET": "dlaas-platform",
        "DLAAS_LOG_STORE_URL": LOG_STORE,
        # The learners' store credentials are assumed from a role (moto's STS).
        "DLAAS_STORE_ROLE_ARN": "arn:aws:iam::123456789012:role/dlaas-learners",
        # Each training's NetworkPolicy lets its pods reach the stores on this machine.
        "DLAAS_K8S_EGRESS_CIDRS": "127.0.0.0/8",
    }


@pytest.fixture
def up(tmp_path: Path, apiserver: RunningApiserver, s3: S3Server) -> Iterator[Up]:
    running = start_up(
        tmp_path / "home",
        None,
        **store_settings(s3),
        KUBECONFIG=str(apiserver.kubeconfig),
        DLAAS_K8S_IMAGE_PREFIX=IMAGE_PREFIX,
        DLAAS_K8S_IMAGE_TAG="1.0",
    )
    try:
        yield running
    finally:
        running.kill()


def horovod(name: str) -> dict[str, Any]:
    """A 2-learner Horovod training: its runtime is in its learner image, nothing to install."""
    return {
        "name": name,
        "framework": {"name": "tensorflow-horovod", "version": "2.21", "command": "python3 x.py"},
        "compute_configuration": {"name": "P100", "nodes": 2},
    }


def until(check: Callable[[], Any], what: str, timeout: float = 30.0) -> Any:
    deadline = time.monotonic() + timeout
    while not (value := check()):
        assert time.monotonic() < deadline, f"{what}: not in {timeout:.0f} s"
        time.sleep(0.05)
    return value


def pods_of(core: client.CoreV1Api, training_id: str) -> dict[str, client.V1Pod]:
    selector = f"{SELECTOR}={label_value(training_id)}"
    pods = core.list_namespaced_pod(NAMESPACE, label_selector=selector).items
    return {pod.metadata.name: pod for pod in pods}


def learner_completed(dlaas: Client, training_id: str, learner_id: int) -> bool:
    (learner,) = [
        lr for lr in dlaas.trainings.get(training_id).learners if lr.learner_id == learner_id
    ]
    return learner.status == "COMPLETED"


def objects_of(core: client.CoreV1Api, training_id: str) -> dict[str, list[str]]:
    selector = f"{SELECTOR}={label_value(training_id)}"
    return {
        "pods": sorted(pods_of(core, training_id)),
        "services": [
            s.metadata.name
            for s in core.list_namespaced_service(NAMESPACE, label_selector=selector).items
        ],
        "secrets": [
            s.metadata.name
            for s in core.list_namespaced_secret(NAMESPACE, label_selector=selector).items
        ],
    }


def test_a_training_runs_as_pods_of_the_cluster_and_completes(
    up: Up, core: client.CoreV1Api
) -> None:
    assert f"learners:      kubernetes, namespace {NAMESPACE}" in up.output
    admin = Client(up.url, (up.home / "admin_api_key").read_text().strip())
    (local,) = [t for t in admin.tenants.list() if t.name == "local"]
    with up.client() as dlaas:
        tid = dlaas.trainings.create(horovod("on-pods"), ENV_CODE).id
        prefix = learner_name_prefix(tid)
        pods = until(lambda: len(pods_of(core, tid)) == 2 and pods_of(core, tid), "2 pods")
        assert sorted(pods) == [f"{prefix}-1", f"{prefix}-2"]
        for i, name in enumerate(sorted(pods), start=1):
            pod = pods[name]
            assert pod.metadata.labels["dlaas.io/training-id"] == label_value(tid)
            assert pod.metadata.labels["dlaas.io/tenant"] == label_value(local.id)
            assert pod.metadata.labels["dlaas.io/learner-id"] == str(i)
            assert pod.spec.hostname == name and pod.spec.subdomain == prefix
            assert pod.spec.restart_policy == "Never"
            assert pod.spec.containers[0].image == f"{IMAGE_PREFIX}learner-horovod-tf2.14:1.0"
        (service,) = core.list_namespaced_service(
            NAMESPACE, label_selector=f"{SELECTOR}={label_value(tid)}"
        ).items
        assert service.metadata.name == prefix and service.spec.cluster_ip == "None"
        assert len(objects_of(core, tid)["secrets"]) == 1
        assert dlaas.trainings.get(tid).status == "PENDING"

        for name in pods:
            kubelet(core, name, "Running", ended(0), RUN, RUN)
        wait_status(dlaas, tid, "RUNNING", timeout=30)
        # The worker's pod ends first, then the launcher's: mpirun ends the job (learner 1
        # completing completes the training, whatever still runs).
        for learner in (2, 1):
            kubelet(core, f"{prefix}-{learner}", "Succeeded", ended(0), ended(0), ended(0))
            until(partial(learner_completed, dlaas, tid, learner), f"learner {learner} ended")
        wait_status(dlaas, tid, "COMPLETED", timeout=30)
        done = dlaas.trainings.get(tid)
        assert [lr.status for lr in done.learners] == ["COMPLETED", "COMPLETED"]
        # Cleaned up once it ended (DLAAS_K8S_POD_TTL_SECONDS is 0): nothing left behind.
        until(
            lambda: objects_of(core, tid) == {"pods": [], "services": [], "secrets": []},
            "the training's objects deleted",
        )
    assert up.stop() == 0, up.output


@contextmanager
def terminating_kubelet(core: client.CoreV1Api) -> Iterator[set[str]]:
    """The kubelet of a node: a pod deleted gracefully (its deletionTimestamp set) has its
    containers stopped by SIGTERM (exit 143), then is deleted for good. Yields the names
    of the pods it stopped."""
    stopped: set[str] = set()
    done = threading.Event()

    def run() -> None:
        while not done.wait(0.05):
            for pod in core.list_namespaced_pod(NAMESPACE).items:
                name = pod.metadata.name
                if pod.metadata.deletion_timestamp is None or name in stopped:
                    continue
                killed = ended(143, "Error")
                kubelet(core, name, "Failed", ended(0), killed, killed)
                core.delete_namespaced_pod(name, NAMESPACE, grace_period_seconds=0)
                stopped.add(name)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    try:
        yield stopped
    finally:
        done.set()
        thread.join(10)


def test_ctrl_c_halts_running_trainings_and_deletes_their_pods(
    up: Up, core: client.CoreV1Api
) -> None:
    with up.client() as dlaas:
        tid = dlaas.trainings.create(horovod("interrupted"), ENV_CODE).id
        pods = until(lambda: len(pods_of(core, tid)) == 2 and pods_of(core, tid), "2 pods")
        for name in pods:
            # Scheduled on a node: deleting the pod waits for its kubelet (graceful).
            core.patch_namespaced_pod(name, NAMESPACE, {"spec": {"nodeName": "node-1"}})
            kubelet(core, name, "Running", ended(0), RUN, RUN)
        wait_status(dlaas, tid, "RUNNING", timeout=30)

    with terminating_kubelet(core) as stopped:
        assert up.stop() == 0, up.output
    assert stopped == set(pods)
    assert f"halted 1 running training(s): {tid}" in up.output
    assert objects_of(core, tid) == {"pods": [], "services": [], "secrets": []}
    engine = make_engine(f"sqlite:///{up.home / 'dlaas.db'}")
    try:
        with engine.connect() as db:
            status, message = db.execute(
                text("SELECT status, status_message FROM trainings WHERE id = :id"), {"id": tid}
            ).one()
    finally:
        engine.dispose()
    assert status == "HALTED"
    assert "the platform was shut down" in message


def test_a_local_store_is_refused_with_the_kubernetes_backend(
    tmp_path: Path, apiserver: RunningApiserver
) -> None:
    env = clean_env(
        tmp_path / "home",
        DLAAS_BACKEND="kubernetes",
        KUBECONFIG=str(apiserver.kubeconfig),
        DLAAS_K8S_NAMESPACE=NAMESPACE,
    )
    result = subprocess.run(
        [DLAAS, "up", "--port", "0"], env=env, capture_output=True, text=True, timeout=60
    )
    assert result.returncode == 1, result.stdout
    assert "DLAAS_S3_ENDPOINT" in result.stderr and "DLAAS_LOG_STORE_URL" in result.stderr
    assert "Traceback" not in result.stderr


def test_without_a_role_for_the_learners_store_credentials_up_refuses(
    tmp_path: Path, apiserver: RunningApiserver, s3: S3Server
) -> None:
    settings = {k: v for k, v in store_settings(s3).items() if k != "DLAAS_STORE_ROLE_ARN"}
    env = clean_env(tmp_path / "home", **settings, KUBECONFIG=str(apiserver.kubeconfig))
    result = subprocess.run(
        [DLAAS, "up", "--port", "0"], env=env, capture_output=True, text=True, timeout=60
    )
    assert result.returncode == 1, result.stdout
    assert "DLAAS_STORE_ROLE_ARN is not set" in result.stderr
    assert "DLAAS_K8S_ALLOW_PLATFORM_STORE_CREDENTIALS=true" in result.stderr
    assert "Traceback" not in result.stderr


def test_an_unreachable_cluster_is_a_clear_error(tmp_path: Path, s3: S3Server) -> None:
    kubeconfig = tmp_path / "kubeconfig"
    kubeconfig.write_text(
        "apiVersion: v1\nkind: Config\ncurrent-context: c\n"
        "clusters: [{name: c, cluster: {server: 'http://127.0.0.1:9'}}]\n"
        "users: [{name: u, user: {token: t}}]\n"
        "contexts: [{name: c, context: {cluster: c, user: u}}]\n"
    )
    env = clean_env(tmp_path / "home", **store_settings(s3), KUBECONFIG=str(kubeconfig))
    env.pop("KUBERNETES_SERVICE_HOST", None)
    result = subprocess.run(
        [DLAAS, "up", "--port", "0"], env=env, capture_output=True, text=True, timeout=90
    )
    assert result.returncode == 1, result.stdout
    assert "the Kubernetes API at http://127.0.0.1:9 did not answer" in result.stderr
    assert "Traceback" not in result.stderr


@contextmanager
def completing_kubelet(core: client.CoreV1Api) -> Iterator[tuple[set[str], list[str]]]:
    """A kubelet whose every learner succeeds: each new pod is run to Succeeded. Yields the
    names of the pods it ran and what went wrong on the way (as text: a pod deleted before
    its turn is not wrong, its training ended with its launcher's pod)."""
    ran: set[str] = set()
    errors: list[str] = []
    done = threading.Event()

    def run() -> None:
        while not done.wait(0.1):
            try:
                for pod in core.list_namespaced_pod(NAMESPACE).items:
                    name = pod.metadata.name
                    if name in ran or (pod.status and pod.status.phase) not in (None, "Pending"):
                        continue
                    try:
                        kubelet(core, name, "Succeeded", ended(0), ended(0), ended(0))
                    except client.ApiException as e:
                        if e.status != 404:
                            raise
                    ran.add(name)
            except Exception as e:  # said in the test's failure; the next round tries again
                errors.append(repr(e))

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    try:
        yield ran, errors
    finally:
        done.set()
        thread.join(10)


def test_the_cluster_suite_runs_against_the_emulated_cluster(
    tmp_path: Path, apiserver: RunningApiserver, core: client.CoreV1Api, s3: S3Server
) -> None:
    """tests/k8s_cluster as a user runs it on kind, with the emulator for the cluster: its
    settings reach `dlaas up`, every numbered example is accepted, becomes pods of the
    learner images and completes (the kubelet here succeeds without running anything)."""
    env = clean_env(
        tmp_path / "unused",
        **store_settings(s3),
        KUBECONFIG=str(apiserver.kubeconfig),
        DLAAS_K8S_IMAGE_PREFIX="dlaas/",
        DLAAS_K8S_IMAGE_TAG="0.1.0",
        DLAAS_TEST_K8S_CLUSTER="1",
        # Generous: the examples run one after another on a shared 2-core machine.
        DLAAS_TEST_K8S_TIMEOUT="240",
    )
    del env["DLAAS_HOME"], env["DLAAS_STOP_GRACE_SECONDS"]
    env.pop("KUBERNETES_SERVICE_HOST", None)
    suite = ["-m", "pytest", "-q", "-m", "k8s_cluster", "-p", "no:cacheprovider"]
    with completing_kubelet(core) as (ran, errors):
        result = subprocess.run(
            [sys.executable, *suite, "--basetemp", str(tmp_path / "suite"), "tests/k8s_cluster"],
            env=env,
            capture_output=True,
            text=True,
            timeout=1200,
            cwd=ROOT,
        )
    assert result.returncode == 0, (result.stdout[-5000:], errors)
    assert f"{len(numbered_examples())} passed" in result.stdout
    # Each example's training ran as pods, all of them deleted once it completed.
    assert len(ran) >= len(numbered_examples())
    assert core.list_namespaced_pod(NAMESPACE).items == []
