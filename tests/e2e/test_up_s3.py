"""`dlaas up` with its object store on S3 (DLAAS_S3_* naming moto's server): everything the
trainings store goes to that endpoint, nothing of it under DLAAS_HOME."""

from __future__ import annotations

import io
import os
import subprocess
import sys
import tarfile
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
import yaml

from tests.conftest import zip_of
from tests.s3_server import ACCESS_KEY, SECRET_KEY, S3Server, free_port, moto_server

pytestmark = pytest.mark.e2e

DLAAS = str(Path(sys.executable).with_name("dlaas"))
PAYLOAD = b"result payload \x00\x01 that must live in S3 only" * 1000
TRAIN_PY = """
import os, pathlib
res = pathlib.Path(os.environ["RESULT_DIR"])
(res / "model").mkdir()
(res / "model" / "weights.bin").write_bytes(PAYLOAD)
print("stored the model", flush=True)
""".replace("PAYLOAD", repr(PAYLOAD))


@pytest.fixture
def s3() -> Iterator[S3Server]:
    with moto_server() as server:
        yield server


@pytest.fixture
def up(tmp_path: Path, s3: S3Server) -> Iterator[tuple[str, Path]]:
    home = tmp_path / "home"
    port = free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith("DLAAS_")}
    env.update(
        DLAAS_HOME=str(home),
        DLAAS_S3_ENDPOINT=s3.url,
        DLAAS_S3_ACCESS_KEY=ACCESS_KEY,
        DLAAS_S3_SECRET_KEY=SECRET_KEY,
        DLAAS_S3_BUCKET="dlaas-platform",
    )
    log = (tmp_path / "up.log").open("w")
    proc = subprocess.Popen(
        [DLAAS, "up", "--port", str(port)], env=env, stdout=log, stderr=subprocess.STDOUT
    )
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                if httpx.get(f"{url}/healthz").status_code == 200:
                    break
            except httpx.TransportError:
                pass
            if proc.poll() is not None or time.monotonic() > deadline:
                pytest.fail(f"dlaas up did not start:\n{(tmp_path / 'up.log').read_text()}")
            time.sleep(0.1)
        yield url, home
    finally:
        proc.terminate()
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        log.close()
        assert SECRET_KEY not in (tmp_path / "up.log").read_text()


def test_dlaas_up_keeps_everything_in_the_s3_endpoint(up: tuple[str, Path], s3: S3Server) -> None:
    url, home = up
    admin = {"Authorization": f"Bearer {(home / 'admin_api_key').read_text().strip()}"}
    r = httpx.post(f"{url}/v1/tenants", json={"name": "s3user", "plan": "standard"}, headers=admin)
    assert r.status_code == 201, r.text
    me = {"Authorization": f"Bearer {r.json()['api_key']}"}
    manifest = {
        "name": "on-s3",
        "framework": {"name": "tensorflow", "version": "2.21", "command": "python3 train.py"},
        "compute_configuration": {"name": "K80", "nodes": 1},
    }
    code = zip_of({"train.py": TRAIN_PY})
    r = httpx.post(
        f"{url}/v1/trainings",
        files={
            "manifest": ("m.yaml", yaml.safe_dump(manifest)),
            "model_definition": ("c.zip", code),
        },
        headers=me,
    )
    assert r.status_code == 201, r.text
    tid = r.json()["id"]
    deadline = time.monotonic() + 60
    while (t := httpx.get(f"{url}/v1/trainings/{tid}", headers=me).json())["status"] not in (
        "COMPLETED",
        "FAILED",
    ):
        assert time.monotonic() < deadline, t
        time.sleep(0.2)
    assert t["status"] == "COMPLETED", t

    # Downloads come from the endpoint.
    files = httpx.get(f"{url}/v1/trainings/{tid}/results", headers=me).json()["files"]
    assert {f["path"] for f in files} == {"model/weights.bin", "learner-1/training-log.txt"}
    r = httpx.get(f"{url}/v1/trainings/{tid}/results/model/weights.bin", headers=me)
    assert r.content == PAYLOAD
    r = httpx.get(
        f"{url}/v1/trainings/{tid}/results/model/weights.bin",
        headers={**me, "Range": "bytes=-10"},
    )
    assert r.status_code == 206 and r.content == PAYLOAD[-10:]
    r = httpx.get(f"{url}/v1/trainings/{tid}/results.tar.gz", headers=me)
    with tarfile.open(fileobj=io.BytesIO(r.content), mode="r:gz") as tar:
        member = tar.extractfile(f"training-{tid}/model/weights.bin")
        assert member is not None and member.read() == PAYLOAD
    r = httpx.get(f"{url}/v1/trainings/{tid}/model_definition", headers=me)
    assert r.content == code

    # Everything is in the platform's bucket ...
    stored = s3.objects("dlaas-platform", f"trainings/{tid}/")
    assert stored[f"trainings/{tid}/results/model/weights.bin"] == PAYLOAD
    assert f"trainings/{tid}/results/learner-1/training-log.txt" in stored
    assert stored[f"trainings/{tid}/model_definition.zip"] == code
    # ... and no result file under DLAAS_HOME once the learners' scratch space is released.
    deadline = time.monotonic() + 15
    while (home / "work" / tid).exists() and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not (home / "work" / tid).exists()
    assert not (home / "objects").exists()
    for path in home.rglob("*"):
        if path.is_file():
            assert path.name != "weights.bin", path
            assert PAYLOAD[:40] not in path.read_bytes(), path

    # Deleting the training empties its place in the bucket.
    assert httpx.delete(f"{url}/v1/trainings/{tid}", headers=me).status_code == 204
    assert s3.objects("dlaas-platform", f"trainings/{tid}/") == {}


COPY_DATA_PY = """
import os, pathlib, shutil
shutil.copy(pathlib.Path(os.environ["DATA_DIR"]) / "a.txt", os.environ["RESULT_DIR"])
"""


def test_by_default_only_the_platform_endpoint_may_hold_a_users_data(
    up: tuple[str, Path], s3: S3Server
) -> None:
    """On one machine, with no DLAAS_ALLOWED_DATA_ENDPOINTS, a manifest may name the
    platform's own S3 endpoint, and no other loopback port."""
    url, home = up
    s3.make_bucket("user-data", {"train/a.txt": b"alpha"})
    admin = {"Authorization": f"Bearer {(home / 'admin_api_key').read_text().strip()}"}
    r = httpx.post(f"{url}/v1/tenants", json={"name": "s3user", "plan": "standard"}, headers=admin)
    me = {"Authorization": f"Bearer {r.json()['api_key']}"}

    def submit(endpoint: str) -> httpx.Response:
        manifest = {
            "name": "with-data",
            "framework": {"name": "tensorflow", "version": "2.21", "command": "python3 c.py"},
            "compute_configuration": {"name": "K80", "nodes": 1},
            "training_data_reference": {
                "type": "s3",
                "connection": {
                    "endpoint_url": endpoint,
                    "access_key_id": ACCESS_KEY,
                    "secret_access_key": SECRET_KEY,
                },
                "source": {"bucket": "user-data", "prefix": "train"},
            },
        }
        return httpx.post(
            f"{url}/v1/trainings",
            files={
                "manifest": ("m.yaml", yaml.safe_dump(manifest)),
                "model_definition": ("c.zip", zip_of({"c.py": COPY_DATA_PY})),
            },
            headers=me,
        )

    other = f"http://127.0.0.1:{free_port()}"
    r = submit(other)
    assert r.status_code == 422, r.text
    assert [(e["field"], e["message"]) for e in r.json()["errors"]] == [
        (
            "/training_data_reference/connection/endpoint_url",
            f"{other} is not an allowed data endpoint on this platform (the operator lists "
            "them in DLAAS_ALLOWED_DATA_ENDPOINTS)",
        )
    ]

    r = submit(s3.url)
    assert r.status_code == 201, r.text
    tid = r.json()["id"]
    deadline = time.monotonic() + 60
    while (t := httpx.get(f"{url}/v1/trainings/{tid}", headers=me).json())["status"] not in (
        "COMPLETED",
        "FAILED",
    ):
        assert time.monotonic() < deadline, t
        time.sleep(0.2)
    assert t["status"] == "COMPLETED", t
    r = httpx.get(f"{url}/v1/trainings/{tid}/results/a.txt", headers=me)
    assert r.content == b"alpha"
