"""Every manifest rule through POST /v1/trainings: the status code, problem+json, the field."""

from __future__ import annotations

import json
import time
from typing import Any

import pytest
from fastapi.testclient import TestClient

from service.platform import Platform
from tests.conftest import create_tenant, manifest_yaml, submit
from tests.manifest_cases import ACCEPTED, REJECTED, Case


@pytest.mark.parametrize("case", REJECTED, ids=lambda c: c.id)
def test_rule_violations_are_refused(client: TestClient, case: Case) -> None:
    headers = create_tenant(client, f"t-{case.id}", case.plan)
    r = submit(client, headers, json.dumps(case.manifest))
    assert r.status_code == case.status, r.text
    assert r.headers["content-type"] == "application/problem+json"
    body = r.json()
    assert body["status"] == case.status
    fields = {e["field"]: e["message"] for e in body["errors"]}
    assert case.field in fields, body
    assert case.words in fields[case.field]
    # Nothing was kept of a refused submission.
    assert client.get("/v1/trainings", headers=headers).json()["items"] == []


def _framework(manifest: dict[str, Any]) -> tuple[str, str]:
    fw = manifest.get("framework", {})
    return (
        fw.get("name", manifest.get("FRAMEWORK_NAME")),
        str(fw.get("version", manifest.get("FRAMEWORK_VERSION"))),
    )


@pytest.mark.parametrize(("name", "manifest", "plan"), ACCEPTED, ids=[a[0] for a in ACCEPTED])
def test_valid_manifests_are_accepted(
    client: TestClient, platform: Platform, name: str, manifest: dict[str, Any], plan: str
) -> None:
    headers = create_tenant(client, f"t-{name}", plan)
    r = submit(client, headers, json.dumps(manifest))
    runtime = platform.catalog.runtime(*_framework(manifest))
    if runtime not in platform.installed_runtimes():
        # Valid, but its runtime is not installed in these tests' empty runtimes directory
        # (tests/api/test_runtime_check.py): refused for that alone.
        assert r.status_code == 422, r.text
        # Named as the manifest writes it (the seed documents' flat keys, or the nested form).
        written = "/FRAMEWORK_VERSION" if "FRAMEWORK_VERSION" in manifest else "/framework/version"
        assert [e["field"] for e in r.json()["errors"]] == [written]
        assert f"dlaas runtimes install {runtime}" in r.json()["detail"]
        return
    assert r.status_code == 201, r.text
    assert r.json()["compute_configuration"]["nodes"] == manifest.get(
        "compute_configuration", manifest.get("COMPUTE_CONFIGURATION", {})
    ).get("nodes", 1)


@pytest.mark.parametrize(
    ("manifest", "words"),
    [
        ("name: [unclosed", "not valid YAML or JSON"),
        ("- a\n- list\n", "mapping"),
        (b"\xff\xfe", "not UTF-8"),
    ],
)
def test_unparseable_manifest_is_a_400(
    client: TestClient, tenant: dict[str, str], manifest: str | bytes, words: str
) -> None:
    r = submit(client, tenant, manifest)
    assert r.status_code == 400
    body = r.json()
    assert body["errors"][0]["field"] == "manifest"
    assert words in body["detail"]


def test_missing_parts_name_the_field(client: TestClient, tenant: dict[str, str]) -> None:
    r = client.post("/v1/trainings", files={"manifest": ("m.yaml", "name: x")}, headers=tenant)
    assert r.status_code == 422
    assert [e["field"] for e in r.json()["errors"]] == ["model_definition"]


def test_a_manifest_with_anchors_and_aliases_is_accepted(
    client: TestClient, tenant: dict[str, str]
) -> None:
    # One connection used for the data and the results, as PyYAML writes it: &id001/*id001.
    connection = {
        "endpoint_url": "http://127.0.0.1:9000",
        "access_key_id": "a",
        "secret_access_key": "b",
    }
    text = manifest_yaml(
        training_data_reference={
            "type": "s3",
            "connection": connection,
            "source": {"bucket": "data"},
        },
        training_results_reference={
            "type": "s3",
            "connection": connection,
            "target": {"bucket": "results"},
        },
    )
    assert "*id001" in text
    r = submit(client, tenant, text)
    assert r.status_code == 201, r.text


def test_an_alias_bomb_is_a_400_naming_the_manifest(
    client: TestClient, tenant: dict[str, str]
) -> None:
    bomb = "\n".join(
        ["a0: &a0 [lol, lol, lol, lol, lol, lol, lol, lol, lol]"]
        + [f"a{i}: &a{i} [" + ", ".join([f"*a{i - 1}"] * 9) + "]" for i in range(1, 10)]
    )
    started = time.monotonic()
    r = submit(client, tenant, bomb)
    assert time.monotonic() - started < 1.0
    assert r.status_code == 400
    assert r.headers["content-type"] == "application/problem+json"
    body = r.json()
    assert body["errors"][0]["field"] == "manifest"
    assert "expands to more than 10000 YAML nodes" in body["errors"][0]["message"]


def test_deep_nesting_is_a_400_naming_the_manifest(
    client: TestClient, tenant: dict[str, str]
) -> None:
    r = submit(client, tenant, "x: " + "[" * 10_000 + "]" * 10_000)
    assert r.status_code == 400
    assert r.json()["errors"][0]["field"] == "manifest"
    assert "nests deeper than 64 levels" in r.json()["detail"]
