"""POST /v1/trainings with an FfDL manifest as FfDL wrote it: accepted, translated, and
shown back both ways (`manifest` as translated, `submitted_manifest` as sent, credentials
masked in both); refusals name the FfDL field, the data endpoint's and the bucket's
included; a manifest in the platform's own format is kept as sent too."""

from __future__ import annotations

from typing import Any

import yaml
from fastapi.testclient import TestClient

from service.db.models import Training
from service.platform import Platform
from tests.conftest import manifest_yaml, submit

FFDL_DISTRIBUTED = """\
name: Distributed-tensorflow-mnist
description: Distributed Mnist training
version: "1.0"
gpus: 0
memory: 1GiB
cpus: 1
learners: 2

data_stores:
  - id: sl-internal-os
    type: mount_cos
    training_data:
      container: tf_training_data
    training_results:
      container: tf_trained_model
    connection:
      auth_url: http://127.0.0.1:9000
      user_name: test
      password: s3cret

framework:
  name: tensorflow
  version: "1.5.0-py3"
  command: PS_HOSTS_COUNT=1 ./launcher.py python3 mnist_dist.py --data_dir ${DATA_DIR}
"""


def _ffdl(**changes: Any) -> str:
    doc = yaml.safe_load(FFDL_DISTRIBUTED)
    doc.update(changes)
    return yaml.safe_dump(doc)


def test_an_ffdl_manifest_is_accepted_and_shown_both_ways(
    client: TestClient, tenant: dict[str, str], platform: Platform
) -> None:
    r = submit(client, tenant, FFDL_DISTRIBUTED)
    assert r.status_code == 201, r.text
    t = r.json()
    assert t["framework"] == {"name": "tensorflow", "version": "1.5"}
    assert t["compute_configuration"] == {"name": "P100", "nodes": 2}
    assert t["manifest"]["conventions"] == "ffdl"
    assert t["manifest"]["framework"]["parameter_servers"] == 1
    assert t["manifest"]["training_data_reference"] == {
        "type": "s3",
        "connection": {
            "endpoint_url": "http://127.0.0.1:9000",
            "access_key_id": "***",
            "secret_access_key": "***",
        },
        "source": {"bucket": "tf_training_data", "prefix": ""},
    }
    sent = yaml.safe_load(FFDL_DISTRIBUTED)
    sent["data_stores"][0]["connection"].update(user_name="***", password="***")
    assert t["submitted_manifest"] == sent
    assert "compute configuration P100" in t["status_history"][0]["message"]
    shown = client.get(f"/v1/trainings/{t['id']}", headers=tenant).json()
    assert shown == t
    assert client.get("/v1/trainings", headers=tenant).json()["items"][0] == t
    with platform.sessions() as session:
        stored = session.get(Training, t["id"])
        assert stored is not None
        assert "s3cret" not in str(stored.submitted_manifest)
        assert stored.manifest["training_data_reference"]["connection"][
            "secret_access_key"
        ].startswith("fernet:")


def test_the_platforms_own_manifest_is_kept_as_sent(
    client: TestClient, tenant: dict[str, str]
) -> None:
    doc = {
        "name": "seed-style",
        "FRAMEWORK_NAME": "tensorflow",
        "FRAMEWORK_VERSION": "2.21",
        "EXECUTION_COMMAND": "python3 train.py",
        "COMPUTE_CONFIGURATION": {"name": "P100", "nodes": 1},
    }
    r = submit(client, tenant, yaml.safe_dump(doc))
    assert r.status_code == 201, r.text
    t = r.json()
    assert t["submitted_manifest"] == doc
    assert "conventions" not in t["manifest"]
    assert t["manifest"]["framework"]["name"] == "tensorflow"


def test_refusals_name_the_ffdl_field(client: TestClient, tenant: dict[str, str]) -> None:
    r = submit(client, tenant, _ffdl(framework={"name": "caffe", "version": "cpu", "command": "x"}))
    assert r.status_code == 422
    errors = r.json()["errors"]
    assert errors[0]["field"] == "/framework/name"
    assert (
        "offered: tensorflow (as tensorflow), horovod (as tensorflow-horovod)"
        in (errors[0]["message"])
    )


def test_the_data_endpoint_goes_through_the_allowlist(
    client: TestClient, tenant: dict[str, str]
) -> None:
    doc = yaml.safe_load(FFDL_DISTRIBUTED)
    doc["data_stores"][0]["connection"]["auth_url"] = "http://s3.default.svc.cluster.local"
    r = submit(client, tenant, yaml.safe_dump(doc))
    assert r.status_code == 422, r.text
    fields = {e["field"] for e in r.json()["errors"]}
    assert fields == {"/data_stores/0/connection/auth_url"}


def test_bucket_names_with_underscores_are_legal_others_are_not(
    client: TestClient, tenant: dict[str, str]
) -> None:
    doc = yaml.safe_load(FFDL_DISTRIBUTED)
    doc["data_stores"][0]["training_data"]["container"] = "TF Data"
    r = submit(client, tenant, yaml.safe_dump(doc))
    assert r.status_code == 422, r.text
    errors = r.json()["errors"]
    assert [e["field"] for e in errors] == ["/data_stores/0/training_data/container"]
    assert "'_'" in errors[0]["message"]
    # The platform's own manifest takes them too.
    own = yaml.safe_load(manifest_yaml())
    own["training_data_reference"] = {
        "type": "s3",
        "connection": {
            "endpoint_url": "http://127.0.0.1:9000",
            "access_key_id": "a",
            "secret_access_key": "b",
        },
        "source": {"bucket": "tf_training_data"},
    }
    assert submit(client, tenant, yaml.safe_dump(own)).status_code == 201


def test_an_ffdl_manifest_on_a_plan_without_distribution_names_learners(
    client: TestClient, tenant: dict[str, str]
) -> None:
    from tests.conftest import create_tenant

    lite = create_tenant(client, "small", "lite")
    r = submit(client, lite, FFDL_DISTRIBUTED)
    assert r.status_code == 422, r.text
    assert [e["field"] for e in r.json()["errors"]] == ["/learners"]
