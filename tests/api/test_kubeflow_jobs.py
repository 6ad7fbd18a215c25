"""Kubeflow TFJob and MPIJob files through POST /v1/trainings, the YAML as the manifest:
taken as the manifest they translate to, or refused with problem+json naming the job's
field (a JSON pointer into the YAML as sent), nothing kept."""

from __future__ import annotations

from pathlib import Path

import yaml
from fastapi.testclient import TestClient

from tests.conftest import submit

EXAMPLES = Path(__file__).resolve().parents[2] / "examples" / "kubeflow"
TFJOB_TEXT = (EXAMPLES / "tfjob-ps.yaml").read_text()
WORKER = "/spec/tfReplicaSpecs/Worker/template/spec"


def refused(client: TestClient, headers: dict[str, str], text: str) -> dict[str, str]:
    r = submit(client, headers, text)
    assert r.status_code == 422, r.text
    assert r.headers["content-type"] == "application/problem+json"
    # Nothing was kept of a refused submission.
    assert client.get("/v1/trainings", headers=headers).json()["items"] == []
    return {e["field"]: e["message"] for e in r.json()["errors"]}


def test_the_tfjob_file_as_sent_is_a_training(client: TestClient, tenant: dict[str, str]) -> None:
    r = submit(client, tenant, TFJOB_TEXT)
    assert r.status_code == 201, r.text
    body = r.json()
    assert body["name"] == "ps-seed-tfjob"
    assert body["framework"] == {"name": "tensorflow", "version": "2.21"}
    assert body["compute_configuration"] == {"name": "P100", "nodes": 3}
    assert body["max_runtime"] == 1800
    assert [learner["learner_id"] for learner in body["learners"]] == [1, 2, 3]
    # Shown back as both: the manifest it runs, and the job as sent.
    shown = client.get(f"/v1/trainings/{body['id']}", headers=tenant).json()
    assert shown["submitted_manifest"] == yaml.safe_load(TFJOB_TEXT)
    assert shown["manifest"]["framework"] == {
        "name": "tensorflow",
        "version": "2.21",
        "command": "python3 launcher.py --steps 100",
        "parameter_servers": 1,
    }
    queued = shown["status_history"][0]["message"]
    assert queued.startswith(
        "translated from a Kubeflow TFJob or MPIJob: image tensorflow/tensorflow"
    )
    assert "compute configuration P100: the smallest that holds 1 GPU(s)" in queued


def test_a_tfjob_with_a_volume_is_refused_naming_it(
    client: TestClient, tenant: dict[str, str]
) -> None:
    job = yaml.safe_load(TFJOB_TEXT)
    worker = job["spec"]["tfReplicaSpecs"]["Worker"]["template"]["spec"]
    worker["volumes"] = [{"name": "data", "persistentVolumeClaim": {"claimName": "mnist"}}]
    worker["containers"][0]["volumeMounts"] = [{"name": "data", "mountPath": "/data"}]
    fields = refused(client, tenant, yaml.safe_dump(job))
    assert "learners have no volumes" in fields[f"{WORKER}/volumes"]
    assert "learners have no volumes" in fields[f"{WORKER}/containers/0/volumeMounts"]


def test_a_tfjob_with_a_foreign_image_is_refused_naming_it(
    client: TestClient, tenant: dict[str, str]
) -> None:
    text = TFJOB_TEXT.replace("tensorflow/tensorflow:2.15.0", "kubeflow/tf-dist-mnist-test:1.0")
    fields = refused(client, tenant, text)
    message = fields["/spec/tfReplicaSpecs/PS/template/spec/containers/0/image"]
    assert "'kubeflow/tf-dist-mnist-test:1.0' names no runtime of this platform" in message
    assert "tensorflow/tensorflow:2.* (tensorflow 2.21)" in message
    assert "dlaas/learner-platform (tensorflow)" in message


def test_a_runtime_not_installed_names_the_image(
    client: TestClient, tenant: dict[str, str]
) -> None:
    """The Horovod runtime is not installed in these tests' runtimes directory: the
    refusal the platform's manifest gets at /framework/version names the job's image."""
    fields = refused(client, tenant, (EXAMPLES / "mpijob-horovod.yaml").read_text())
    message = fields["/spec/mpiReplicaSpecs/Launcher/template/spec/containers/0/image"]
    assert "dlaas runtimes install horovod-tf2.14" in message


def test_a_kind_the_platform_does_not_take_is_refused(
    client: TestClient, tenant: dict[str, str]
) -> None:
    text = TFJOB_TEXT.replace("kind: TFJob", "kind: PyTorchJob")
    fields = refused(client, tenant, text)
    assert "accepted: kubeflow.org/v1 TFJob, kubeflow.org/v2beta1 MPIJob" in fields["/kind"]
