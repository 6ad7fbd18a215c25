"""docker/compose.yaml is a valid Compose file (the Compose Specification's JSON schema, as
check-jsonschema ships it: nothing of it is kept in this repository) that runs the
platform's processes with commands and settings the package has. No docker daemon here:
nothing is started."""

from __future__ import annotations

import copy
import json
from importlib import resources
from pathlib import Path
from typing import Any

import jsonschema
import pytest
import yaml

from service.settings import Settings
from tests.deploy.commands import ROOT, command_problems

COMPOSE = ROOT / "docker" / "compose.yaml"
PLATFORM_SERVICES = ("api", "worker", "monitor")


@pytest.fixture(scope="module")
def schema() -> dict[str, Any]:
    text = (
        resources.files("check_jsonschema.builtin_schemas.vendor") / "compose-spec.json"
    ).read_text()
    loaded: dict[str, Any] = json.loads(text)
    return loaded


@pytest.fixture(scope="module")
def compose() -> dict[str, Any]:
    loaded: dict[str, Any] = yaml.safe_load(COMPOSE.read_text())
    return loaded


def _errors(schema: dict[str, Any], doc: dict[str, Any]) -> list[str]:
    validator = jsonschema.validators.validator_for(schema)(schema)
    return [f"{e.json_path}: {e.message}" for e in validator.iter_errors(doc)]


def test_compose_file_follows_the_compose_specification(
    schema: dict[str, Any], compose: dict[str, Any]
) -> None:
    assert "compose" in schema.get("$id", "") + schema.get("title", "").lower()
    assert _errors(schema, compose) == []


def test_the_schema_check_can_fail(schema: dict[str, Any], compose: dict[str, Any]) -> None:
    broken = copy.deepcopy(compose)
    broken["services"]["api"]["restart_policy"] = "always"  # not a service field
    broken["services"]["worker"]["depends_on"] = {"api": {"condition": "started"}}
    assert len(_errors(schema, broken)) >= 2


def test_it_runs_the_services_of_one_host(compose: dict[str, Any]) -> None:
    assert set(compose["services"]) == {"postgres", "redis", "minio", *PLATFORM_SERVICES}
    for name in PLATFORM_SERVICES:
        service = compose["services"][name]
        context = (COMPOSE.parent / service["build"]["context"]).resolve()
        assert context == ROOT
        assert (context / service["build"]["dockerfile"]).is_file()
        for dependency in ("postgres", "redis", "minio"):
            assert service["depends_on"][dependency]["condition"] == "service_healthy"


def test_platform_commands_name_what_the_package_has(compose: dict[str, Any]) -> None:
    for name in PLATFORM_SERVICES:
        command = compose["services"][name]["command"]
        assert command_problems(command) == [], name
    assert compose["services"]["worker"]["command"] == ["python", "-m", "worker"]
    assert compose["services"]["monitor"]["command"] == ["python", "-m", "worker.monitor"]


def test_settings_are_the_platforms(compose: dict[str, Any]) -> None:
    known = {f"DLAAS_{name.upper()}" for name in Settings.model_fields}
    for name in PLATFORM_SERVICES:
        env = compose["services"][name]["environment"]
        assert set(env) <= known, set(env) - known
        assert env["DLAAS_DATABASE_URL"].startswith("postgresql+psycopg://")
        assert "@postgres:5432/" in env["DLAAS_DATABASE_URL"]
        assert env["DLAAS_BROKER_URL"] == "redis://redis:6379/0"
        assert env["DLAAS_S3_ENDPOINT"] == "http://minio:9000"


def test_the_monitor_sees_the_workers_learners(compose: dict[str, Any]) -> None:
    """The local backend's learners are processes of the worker's container, observed by
    the monitor through their status files and /proc."""
    worker, monitor = compose["services"]["worker"], compose["services"]["monitor"]
    assert monitor["pid"] == "service:worker"
    home = Path(worker["environment"]["DLAAS_HOME"])
    shared = {v for v in worker["volumes"]} & {v for v in monitor["volumes"]}
    assert any(home.is_relative_to(v.split(":")[1]) for v in shared)


def test_the_api_is_checked_for_readiness(compose: dict[str, Any]) -> None:
    check = " ".join(compose["services"]["api"]["healthcheck"]["test"])
    assert "/readyz" in check
