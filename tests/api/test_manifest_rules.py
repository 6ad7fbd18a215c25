"""Every manifest rule through POST /v1/trainings: the status code, problem+json, the field."""

from __future__ import annotations

import json
from typing import Any

import pytest
from fastapi.testclient import TestClient

from tests.conftest import create_tenant, submit
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


@pytest.mark.parametrize(("name", "manifest", "plan"), ACCEPTED, ids=[a[0] for a in ACCEPTED])
def test_valid_manifests_are_accepted(
    client: TestClient, name: str, manifest: dict[str, Any], plan: str
) -> None:
    headers = create_tenant(client, f"t-{name}", plan)
    r = submit(client, headers, json.dumps(manifest))
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
