"""Downloads (results, one file with Range, .tar.gz, the code archive), credentials masked
and encrypted at rest, and the SSRF guard on users' endpoints."""

from __future__ import annotations

import io
import tarfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from fastapi.testclient import TestClient
from sqlalchemy import select

from service.api.app import create_app
from service.db.models import Training
from service.platform import Platform
from service.settings import Settings
from tests.conftest import ADMIN_KEY, CODE_ZIP, create_tenant, manifest_yaml, submit
from tests.s3_server import free_port

FILES = {
    "model/saved_model.pb": b"the model" * 100,
    "model/variables/variables.data-00000-of-00001": bytes(range(256)) * 4,
    "learner-1/training-log.txt": b"2024-01-01T00:00:00.000Z step 1 loss=0.5\n",
    "learner-1/logs/tb/events.out": b"ev",
    "notes \u00e9t\u00e9.txt": b"unicode name",
}


@pytest.fixture
def training(client: TestClient, tenant: dict[str, str], platform: Platform) -> str:
    r = submit(client, tenant)
    assert r.status_code == 201, r.text
    training_id: str = r.json()["id"]
    for path, data in FILES.items():
        key = f"trainings/{training_id}/results/{path}"
        platform.store.put_stream(key, io.BytesIO(data), len(data))
    return training_id


def url(training_id: str, rest: str) -> str:
    return f"/v1/trainings/{training_id}/{rest}"


def test_results_are_listed(client: TestClient, tenant: dict[str, str], training: str) -> None:
    r = client.get(url(training, "results"), headers=tenant)
    assert r.status_code == 200, r.text
    files = r.json()["files"]
    assert [f["path"] for f in files] == sorted(FILES)
    assert {f["path"]: f["size"] for f in files} == {p: len(d) for p, d in FILES.items()}
    assert all(f["last_modified"] for f in files)


def test_one_file_streams_with_its_headers(
    client: TestClient, tenant: dict[str, str], training: str
) -> None:
    r = client.get(url(training, "results/model/saved_model.pb"), headers=tenant)
    assert r.status_code == 200, r.text
    assert r.content == FILES["model/saved_model.pb"]
    assert r.headers["content-length"] == str(len(FILES["model/saved_model.pb"]))
    assert r.headers["accept-ranges"] == "bytes"
    assert 'filename="saved_model.pb"' in r.headers["content-disposition"]
    r = client.get(url(training, "results/notes%20%C3%A9t%C3%A9.txt"), headers=tenant)
    assert r.status_code == 200 and r.content == b"unicode name"
    assert "filename*=UTF-8''notes%20%C3%A9t%C3%A9.txt" in r.headers["content-disposition"]


@pytest.mark.parametrize(
    ("header", "start", "end"),
    [("bytes=10-19", 10, 20), ("bytes=1000-", 1000, 1024), ("bytes=-24", 1000, 1024)],
)
def test_range_requests(
    client: TestClient, tenant: dict[str, str], training: str, header: str, start: int, end: int
) -> None:
    path = "model/variables/variables.data-00000-of-00001"
    r = client.get(url(training, f"results/{path}"), headers={**tenant, "Range": header})
    assert r.status_code == 206, r.text
    assert r.content == FILES[path][start:end]
    assert r.headers["content-range"] == f"bytes {start}-{end - 1}/1024"
    assert r.headers["content-length"] == str(end - start)


def test_unsatisfiable_and_ignored_ranges(
    client: TestClient, tenant: dict[str, str], training: str
) -> None:
    path = url(training, "results/model/variables/variables.data-00000-of-00001")
    r = client.get(path, headers={**tenant, "Range": "bytes=1024-"})
    assert r.status_code == 416
    assert r.headers["content-type"] == "application/problem+json"
    assert r.headers["content-range"] == "bytes */1024"
    assert r.json()["errors"][0]["field"] == "Range"
    r = client.get(path, headers={**tenant, "Range": "bytes=0-1,5-6"})
    assert r.status_code == 200 and len(r.content) == 1024


@pytest.mark.parametrize(
    "path",
    [
        "results/%2E%2E/model_definition.zip",
        "results/model/%2E%2E/%2E%2E/model_definition.zip",
        "results/model//saved_model.pb",
        "results/%2Fetc/passwd",
        "results/",
    ],
)
def test_paths_that_climb_are_refused(
    client: TestClient, tenant: dict[str, str], training: str, path: str
) -> None:
    r = client.get(url(training, path), headers=tenant)
    assert r.status_code == 400, r.text
    assert r.json()["errors"][0]["field"] == "path"


def test_missing_files_and_other_tenants(
    client: TestClient, tenant: dict[str, str], training: str
) -> None:
    r = client.get(url(training, "results/model/nope.pb"), headers=tenant)
    assert r.status_code == 404
    assert r.headers["content-type"] == "application/problem+json"
    other = create_tenant(client, "other")
    for rest in ("results", "results/model/saved_model.pb", "results.tar.gz", "model_definition"):
        assert client.get(url(training, rest), headers=other).status_code == 404, rest
    assert client.get(url("nope", "results"), headers=tenant).status_code == 404


def test_all_results_as_tar_gz(client: TestClient, tenant: dict[str, str], training: str) -> None:
    r = client.get(url(training, "results.tar.gz"), headers=tenant)
    assert r.status_code == 200, r.text
    assert r.headers["content-type"] == "application/gzip"
    assert f"training-{training}-results.tar.gz" in r.headers["content-disposition"]
    with tarfile.open(fileobj=io.BytesIO(r.content), mode="r:gz") as tar:
        members = {m.name: m for m in tar.getmembers()}
        assert set(members) == {f"training-{training}/{p}" for p in FILES}
        for path, data in FILES.items():
            extracted = tar.extractfile(members[f"training-{training}/{path}"])
            assert extracted is not None and extracted.read() == data


def test_empty_results_and_the_model_definition(client: TestClient, tenant: dict[str, str]) -> None:
    r = submit(client, tenant)
    training = r.json()["id"]
    assert client.get(url(training, "results"), headers=tenant).json() == {
        "files": [],
        "next_cursor": None,
    }
    r = client.get(url(training, "results.tar.gz"), headers=tenant)
    with tarfile.open(fileobj=io.BytesIO(r.content), mode="r:gz") as tar:
        assert tar.getmembers() == []
    r = client.get(url(training, "model_definition"), headers=tenant)
    assert r.status_code == 200
    assert r.content == CODE_ZIP
    assert r.headers["content-type"] == "application/zip"
    assert 'filename="model_definition.zip"' in r.headers["content-disposition"]


def test_delete_removes_the_results(
    client: TestClient, tenant: dict[str, str], training: str, platform: Platform
) -> None:
    assert list(platform.store.list(f"trainings/{training}"))
    assert client.delete(f"/v1/trainings/{training}", headers=tenant).status_code == 204
    assert list(platform.store.list(f"trainings/{training}")) == []
    assert client.get(url(training, "results"), headers=tenant).status_code == 404


# -- data and results references: credentials, SSRF guard -----------------------------------

USER_KEY = "AKIA-USER-7f3k"
USER_SECRET = "user-secret-9Qx2"


def connection(endpoint: str = "http://127.0.0.1:9000") -> dict[str, str]:
    return {
        "endpoint_url": endpoint,
        "access_key_id": USER_KEY,
        "secret_access_key": USER_SECRET,
    }


def references(data_endpoint: str = "http://127.0.0.1:9000", **kw: Any) -> dict[str, Any]:
    return {
        "training_data_reference": {
            "type": "s3",
            "connection": connection(data_endpoint),
            "source": {"bucket": kw.get("data_bucket", "mnist-data"), "prefix": "train/"},
        },
        "training_results_reference": {
            "type": "s3",
            "connection": connection(kw.get("results_endpoint", "http://127.0.0.1:9000")),
            "target": {"bucket": kw.get("results_bucket", "mnist-results")},
        },
    }


def test_credentials_are_masked_and_encrypted_at_rest(
    client: TestClient, tenant: dict[str, str], platform: Platform
) -> None:
    r = submit(client, tenant, manifest_yaml(**references()))
    assert r.status_code == 201, r.text
    assert USER_KEY not in r.text and USER_SECRET not in r.text
    training = r.json()["id"]
    for body in (
        client.get(f"/v1/trainings/{training}", headers=tenant).text,
        client.get("/v1/trainings", headers=tenant).text,
    ):
        assert USER_KEY not in body and USER_SECRET not in body
    shown = client.get(f"/v1/trainings/{training}", headers=tenant).json()
    assert shown["training_data_reference"] == {
        "type": "s3",
        "connection": {
            "endpoint_url": "http://127.0.0.1:9000",
            "access_key_id": "***",
            "secret_access_key": "***",
        },
        "source": {"bucket": "mnist-data", "prefix": "train/"},
    }
    assert shown["training_results_reference"]["connection"]["secret_access_key"] == "***"
    assert shown["training_results_reference"]["target"] == {"bucket": "mnist-results"}
    with platform.sessions() as session:
        stored = session.scalars(select(Training).where(Training.id == training)).one()
        text = repr(stored.manifest)
        conn = stored.manifest["training_data_reference"]["connection"]
    assert USER_KEY not in text and USER_SECRET not in text
    assert conn["secret_access_key"].startswith("fernet:")
    assert platform.secrets.decrypt(conn["secret_access_key"]) == USER_SECRET
    # The model_definition download is the code, never the manifest.
    assert client.get(url(training, "model_definition"), headers=tenant).content == CODE_ZIP
    # A training without references shows none.
    plain = submit(client, tenant).json()
    assert plain["training_data_reference"] is None


@pytest.mark.parametrize(
    ("refs", "field"),
    [
        (references("http://169.254.169.254"), "/training_data_reference/connection/endpoint_url"),
        (references("http://10.0.0.5:9000"), "/training_data_reference/connection/endpoint_url"),
        (references("https://s3.example.com"), "/training_data_reference/connection/endpoint_url"),
        (references("ftp://127.0.0.1"), "/training_data_reference/connection/endpoint_url"),
        (
            references(results_endpoint="http://192.168.0.1"),
            "/training_results_reference/connection/endpoint_url",
        ),
        (references(data_bucket="No_Such"), "/training_data_reference/source/bucket"),
        (references(results_bucket="ab"), "/training_results_reference/target/bucket"),
    ],
)
def test_endpoints_and_buckets_are_checked(
    client: TestClient, tenant: dict[str, str], platform: Platform, refs: dict[str, Any], field: str
) -> None:
    r = submit(client, tenant, manifest_yaml(**refs))
    assert r.status_code == 422, r.text
    assert r.headers["content-type"] == "application/problem+json"
    assert [e["field"] for e in r.json()["errors"]] == [field]
    assert USER_SECRET not in r.text
    assert list(platform.store.list("trainings")) == []  # nothing kept


def test_the_allowlist_is_a_setting(tmp_path: Path, database_url: str) -> None:
    settings = Settings(
        home=tmp_path / "home",
        database_url=database_url,
        admin_api_key=ADMIN_KEY,
        allowed_data_endpoints="10.0.0.5:9000",
    )
    platform = Platform.from_settings(settings)
    try:
        with TestClient(create_app(platform=platform)) as client:
            tenant = create_tenant(client, "acme")
            internal = "http://10.0.0.5:9000"
            refs = references(internal, results_endpoint=internal)
            ok = submit(client, tenant, manifest_yaml(**refs))
            assert ok.status_code == 201, ok.text
            # Only what the list names.
            r = submit(client, tenant, manifest_yaml(**references("http://127.0.0.1:9000")))
            assert r.status_code == 422
    finally:
        platform.close()


@pytest.fixture
def unreachable_platform(tmp_path: Path, database_url: str) -> Iterator[Platform]:
    settings = Settings(
        home=tmp_path / "home",
        database_url=database_url,
        admin_api_key=ADMIN_KEY,
        s3_endpoint=f"http://127.0.0.1:{free_port()}",
        s3_bucket="platform",
    )
    platform = Platform.from_settings(settings)
    yield platform
    platform.close()


def test_an_unreachable_platform_store_is_a_503_naming_it(
    unreachable_platform: Platform,
) -> None:
    endpoint = unreachable_platform.settings.s3_endpoint
    with TestClient(create_app(platform=unreachable_platform)) as client:
        tenant = create_tenant(client, "acme")
        r = submit(client, tenant)
        assert r.status_code == 503, r.text
        detail = r.json()["detail"]
        assert f"the S3 store at {endpoint}" in detail and "'platform'" in detail
        assert client.get("/v1/trainings", headers=tenant).json()["items"] == []


def test_manifests_with_references_round_trip_as_yaml(tmp_path: Path) -> None:
    # The helper above builds what the README documents.
    doc = yaml.safe_load(manifest_yaml(**references()))
    assert doc["training_results_reference"]["target"]["bucket"] == "mnist-results"
