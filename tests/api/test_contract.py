"""The API holds its OpenAPI contract under any input: schemathesis, in-process.

Every operation of the document, with the coverage phase's positive and negative values
(missing, wrong-typed and out-of-range fields, and every method a path does not serve)
and a bounded, seeded fuzzing phase, against an app on SQLite. All of schemathesis's
response checks run (no server error, status code, content type, body schema and headers
as documented, negative data rejected, a 405 naming what is allowed) but one:
`positive_data_acceptance`. It reads any 4xx to schema-valid data as a fault, and the
document cannot say what makes a manifest, a code archive, a list cursor or a plan name
valid (those are rules the API checks and names in its 400/422 problem).
"""

from __future__ import annotations

import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import requests
import schemathesis
from fastapi.testclient import TestClient
from hypothesis import HealthCheck, settings
from schemathesis.checks import negative_data_rejection, positive_data_acceptance
from schemathesis.generation import GenerationMode
from schemathesis.generation.case import Case
from schemathesis.generation.meta import TestPhase

from service.api.app import create_app
from service.platform import Platform
from service.settings import Settings
from tests.conftest import ADMIN_KEY, CODE_ZIP, create_tenant, manifest_yaml, submit


@dataclass(frozen=True)
class Served:
    """The app under test, and what exists in it for generated requests to reach."""

    client: TestClient
    tenant: dict[str, str]
    tenant_id: str
    spare_key_id: str
    training_id: str
    deleted_training_id: str

    def use_real_resources(self, case: Case) -> bool:
        """Point a positive case at resources that exist, and give it what the document
        cannot describe (a valid manifest and code archive, a plan that is offered): random
        ids only ever reach 404s, and the success responses would go unchecked. True when
        it replaced the body with its own."""
        params = case.path_parameters
        if params is not None:
            if "training_id" in params:
                doomed = case.method == "DELETE" and case.path == "/v1/trainings/{training_id}"
                params["training_id"] = self.deleted_training_id if doomed else self.training_id
            if "tenant_id" in params:
                params["tenant_id"] = self.tenant_id
            if "key_id" in params:
                params["key_id"] = self.spare_key_id
        if case.method == "POST" and case.path == "/v1/trainings":
            case.body = {"manifest": manifest_yaml(), "model_definition": CODE_ZIP}
            return True
        if case.method == "POST" and case.path == "/v1/tenants" and isinstance(case.body, dict):
            case.body["plan"] = "standard"
        return False


def _settings(home: Path) -> Settings:
    return Settings(
        home=home, database_url=f"sqlite:///{home / 'dlaas.db'}", admin_api_key=ADMIN_KEY
    )


def _document() -> dict[str, Any]:
    """The document the app serves (built once, from an app on a throwaway home)."""
    with tempfile.TemporaryDirectory() as home:
        platform = Platform.from_settings(_settings(Path(home)))
        try:
            return create_app(platform=platform).openapi()
        finally:
            platform.close()


schema = schemathesis.openapi.from_dict(_document())


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Served]:
    home = tmp_path_factory.mktemp("contract")
    platform = Platform.from_settings(_settings(home))
    with TestClient(create_app(platform=platform), raise_server_exceptions=False) as client:
        tenant = create_tenant(client, "acme")
        admin = {"Authorization": f"Bearer {ADMIN_KEY}"}
        listed = client.get("/v1/tenants", headers=admin).json()["items"]
        tenant_id = next(t["id"] for t in listed if t["name"] == "acme")
        spare = client.post(f"/v1/tenants/{tenant_id}/keys", headers=admin).json()
        read, deleted = (submit(client, tenant).json()["id"] for _ in range(2))
        yield Served(client, tenant, tenant_id, spare["id"], read, deleted)
    platform.close()


# Seeded (derandomize) and bounded, so a CI run is the same run each time (about 15 s).
@schema.parametrize()
@settings(
    max_examples=50,
    deadline=None,
    derandomize=True,
    database=None,
    suppress_health_check=list(HealthCheck),
)
def test_contract(case: Case, served: Served) -> None:
    excluded = [positive_data_acceptance]
    if (
        case.meta is not None
        and case.meta.generation.mode is GenerationMode.POSITIVE
        and case.meta.phase.name is TestPhase.FUZZING
        and served.use_real_resources(case)
    ):
        # The body is ours, not generated: schemathesis re-reads it against the document,
        # where a code archive's bytes are not the `string` a generated one is, and would
        # take the 201 for an accepted invalid request.
        excluded.append(negative_data_rejection)
    admin = case.path.startswith("/v1/tenants")
    headers = {"Authorization": f"Bearer {ADMIN_KEY}"} if admin else served.tenant
    client = served.client
    # Serialised as schemathesis sends it over the network (requests), then sent through the
    # test client, which runs the app's lifespan once for the module.
    kwargs = case.as_transport_kwargs(base_url="http://testserver", headers=headers)
    sent = requests.Request(**kwargs).prepare()
    body = sent.body.encode() if isinstance(sent.body, str) else sent.body
    response = client.request(
        sent.method or "GET", sent.url or "", headers=dict(sent.headers), content=body
    )
    case.validate_response(response, excluded_checks=excluded)


def test_every_refusal_is_documented_as_problem_json() -> None:
    """Each operation lists its 4xx as application/problem+json with the Problem schema
    (TensorFlow Serving's paths, /v1/models/..., as its `{"error"}` body), and FastAPI's
    HTTPValidationError, a shape the API never sends, is gone."""
    document = _document()
    assert "HTTPValidationError" not in document["components"]["schemas"]
    problem = {"application/problem+json": {"schema": {"$ref": "#/components/schemas/Problem"}}}
    serving = {"application/json": {"schema": {"$ref": "#/components/schemas/ServingError"}}}
    assert document["components"]["schemas"]["ServingError"]["required"] == ["error"]
    for path, operations in document["paths"].items():
        for method, operation in operations.items():
            codes = {int(c) for c in operation["responses"] if c.isdigit()}
            if path not in ("/healthz", "/readyz"):
                assert {400, 401, 403, 404, 422} <= codes, (method, path)
            expected = serving if path.startswith("/v1/models/") else problem
            for code in codes:
                if code >= 400:
                    content = operation["responses"][str(code)]["content"]
                    assert content == expected, (method, path, code)


def test_a_method_not_allowed_names_every_method_of_the_path(served: Served) -> None:
    """GET and DELETE /v1/trainings/{id} are two routes: the 405 names both."""
    r = served.client.options(f"/v1/trainings/{served.training_id}", headers=served.tenant)
    assert r.status_code == 405
    assert r.headers["allow"] == "DELETE, GET"
    assert r.headers["content-type"] == "application/problem+json"
    r = served.client.put("/v1/tenants", headers={"Authorization": f"Bearer {ADMIN_KEY}"})
    assert r.status_code == 405
    assert r.headers["allow"] == "GET, POST"
