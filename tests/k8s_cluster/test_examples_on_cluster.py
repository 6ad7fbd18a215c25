"""The numbered example manifests end to end on a real Kubernetes cluster (marker
`k8s_cluster`): a `dlaas up` subprocess with DLAAS_BACKEND=kubernetes drives the cluster of
KUBECONFIG, each example is submitted with its code through the Python client and must
complete, its learners' logs stored in the object store.

Skipped unless DLAAS_TEST_K8S_CLUSTER=1: no cluster runs where CI runs. What it needs (the
README's "Run the examples on a real cluster (kind)" sets it up):
- KUBECONFIG naming the cluster, DLAAS_K8S_NAMESPACE (default `dlaas`) existing there;
- the images in the cluster: DLAAS_K8S_IMAGE_PREFIX and DLAAS_K8S_IMAGE_TAG naming them;
- an S3 endpoint (DLAAS_S3_ENDPOINT, _ACCESS_KEY, _SECRET_KEY, _BUCKET) and a Redis
  (DLAAS_LOG_STORE_URL) that both this machine and the pods reach at the same address.
Every other DLAAS_* setting in the environment is passed to `dlaas up` as well. Unless
DLAAS_CATALOG_FILE names a catalog, the examples' compute configurations are made CPU-only
(tests/k8s_cluster/examples.py::cpu_catalog), so they schedule on kind's nodes.
"""

from __future__ import annotations

import os
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml
from kubernetes import client, config

from dlaas import Client
from service.domain.names import label_value
from tests.e2e.test_up import Up, start_up
from tests.k8s_cluster.examples import Example, cpu_catalog, numbered_examples
from worker.backends.kubernetes.objects import TRAINING_LABEL

CLUSTER = os.environ.get("DLAAS_TEST_K8S_CLUSTER") == "1"

pytestmark = [
    pytest.mark.k8s_cluster,
    pytest.mark.skipif(
        not CLUSTER,
        reason="needs a real Kubernetes cluster: set DLAAS_TEST_K8S_CLUSTER=1 and KUBECONFIG "
        "(README: Run the examples on a real cluster (kind))",
    ),
]

# Needed, with no default that could work: the pods must reach the stores.
REQUIRED = ("DLAAS_S3_ENDPOINT", "DLAAS_S3_ACCESS_KEY", "DLAAS_S3_SECRET_KEY",
            "DLAAS_LOG_STORE_URL")  # fmt: skip
# Seconds one example may take on a small cluster (image pulls, TensorFlow's start).
EXAMPLE_TIMEOUT = float(os.environ.get("DLAAS_TEST_K8S_TIMEOUT", "900"))


def cluster_settings(home: Path) -> dict[str, str]:
    """The caller's DLAAS_* settings for `dlaas up`, with the kubernetes backend and, unless
    a catalog is given, the CPU-only one written under `home`'s parent."""
    missing = [name for name in REQUIRED if not os.environ.get(name)]
    if missing or not os.environ.get("KUBECONFIG"):
        pytest.fail(
            "DLAAS_TEST_K8S_CLUSTER=1 needs KUBECONFIG and " + ", ".join(missing or REQUIRED)
        )
    settings = {
        k: v
        for k, v in os.environ.items()
        if k.startswith("DLAAS_") and not k.startswith("DLAAS_TEST_") and k != "DLAAS_HOME"
    }
    settings.update(DLAAS_BACKEND="kubernetes", KUBECONFIG=os.environ["KUBECONFIG"])
    if "DLAAS_CATALOG_FILE" not in settings:
        catalog = home.parent / "cpu-catalog.yaml"
        catalog.write_text(yaml.safe_dump(cpu_catalog()))
        settings["DLAAS_CATALOG_FILE"] = str(catalog)
    return settings


@pytest.fixture(scope="module")
def up(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Up]:
    home = tmp_path_factory.mktemp("k8s-cluster") / "home"
    running = start_up(home, None, **cluster_settings(home))
    try:
        yield running
    finally:
        if running.proc.poll() is None:
            running.stop()  # Ctrl-C: halts what still runs, deletes its pods
        running.kill()


@pytest.mark.parametrize("example", numbered_examples(), ids=lambda e: e.name)
def test_example_completes_on_the_cluster(up: Up, example: Example) -> None:
    with up.client() as dlaas:
        training = dlaas.trainings.create(example.manifest, example.code)
        done = dlaas.trainings.wait(training.id, timeout=EXAMPLE_TIMEOUT, poll_interval=2)
        assert done.status == "COMPLETED", (done.status_message, done.learners)
        logs = {f"learner-{learner.learner_id}/training-log.txt" for learner in done.learners}
        stored = stored_results(dlaas, training.id, logs, timeout=120)
        assert logs <= stored, stored
    # Its pods are deleted once it has ended (no DLAAS_K8S_POD_TTL_SECONDS here).
    assert pods_gone(training.id, timeout=120), f"pods of {training.id} left behind"


def stored_results(dlaas: Client, training_id: str, wanted: set[str], timeout: float) -> set[str]:
    """The training's stored result paths once they include `wanted`, or as they are after
    `timeout` seconds. A pod's agent stores its learner's log before the pod ends; where it
    did not (it never ran, or could not reach the store), the platform's wrap-up writes the
    log from the log store just after the training ended."""
    deadline = time.monotonic() + timeout
    while True:
        stored = {f.path for f in dlaas.trainings.results(training_id)}
        if wanted <= stored or time.monotonic() > deadline:
            return stored
        time.sleep(1)


def pods_gone(training_id: str, timeout: float) -> bool:
    """Whether the cluster has no pod of the training left within `timeout` seconds."""
    config.load_kube_config()
    core = client.CoreV1Api()
    namespace = os.environ.get("DLAAS_K8S_NAMESPACE", "dlaas")
    selector = f"{TRAINING_LABEL}={label_value(training_id)}"
    deadline = time.monotonic() + timeout
    try:
        while core.list_namespaced_pod(namespace, label_selector=selector).items:
            if time.monotonic() > deadline:
                return False
            time.sleep(1)
        return True
    finally:
        core.api_client.close()
