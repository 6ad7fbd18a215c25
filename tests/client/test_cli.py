"""The `dlaas` command line's failure reports, in-process: each invocation's options live in
its own typer context, so one command's --json never decides how the next one reports."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from dlaas import cli
from dlaas.cli import app
from dlaas.client import Client
from service.domain.catalog import DEFAULT_CATALOG
from tests.client.conftest import SyncASGITransport
from tests.conftest import ADMIN_KEY

UNREACHABLE = "http://127.0.0.1:9"


def dlaas(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[object, str, str]:
    with pytest.raises(SystemExit) as exited:
        app(["--url", UNREACHABLE, "--api-key", "key", *args], prog_name="dlaas")
    captured = capsys.readouterr()
    return exited.value.code, captured.out, captured.err


def test_a_failure_under_json_is_also_a_document_on_stdout(
    capsys: pytest.CaptureFixture[str],
) -> None:
    code, out, err = dlaas(capsys, "show", "t1", "--json")
    assert code == 1
    problem = json.loads(out)
    assert problem["title"] == "ConnectionFailed" and UNREACHABLE in problem["detail"]
    assert "error:" in err and UNREACHABLE in err and "Traceback" not in err


@pytest.mark.parametrize("args", [["show", "t1"], ["logs", "t1"], ["deployments", "list"]])
def test_json_does_not_carry_over_to_the_next_invocation(
    capsys: pytest.CaptureFixture[str], args: list[str]
) -> None:
    assert dlaas(capsys, "list", "--json")[0] == 1
    code, out, err = dlaas(capsys, *args)
    assert code == 1 and out == ""
    assert "error:" in err and UNREACHABLE in err


# -- tenants keys, against the app ---------------------------------------------------------


@pytest.fixture
def against_app(
    transport: SyncASGITransport, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """The CLI's clients talk to the app; no key or configuration comes from outside."""
    for name in ("DLAAS_URL", "DLAAS_API_KEY", "DLAAS_CONFIG", "DLAAS_ADMIN_API_KEY"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("DLAAS_HOME", str(tmp_path / "client-home"))

    def client(url: str | None = None, api_key: str | None = None) -> Client:
        return Client(url or "http://dlaas.test", api_key, transport=transport)

    monkeypatch.setattr(cli, "Client", client)


def run(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[object, str, str]:
    with pytest.raises(SystemExit) as exited:
        app(list(args), prog_name="dlaas")
    captured = capsys.readouterr()
    return exited.value.code, captured.out, captured.err


def new_tenant(capsys: pytest.CaptureFixture[str], name: str) -> dict[str, Any]:
    code, out, _ = run(
        capsys, "tenants", "create", name, "--plan", "lite", "--admin-key", ADMIN_KEY, "--json"
    )
    assert code == 0
    tenant: dict[str, Any] = json.loads(out)
    return tenant


@pytest.mark.usefixtures("against_app")
def test_tenants_keys_create_list_and_revoke(capsys: pytest.CaptureFixture[str]) -> None:
    tenant = new_tenant(capsys, "acme")
    admin = ("--admin-key", ADMIN_KEY)
    code, out, _ = run(capsys, "tenants", "keys", "create", tenant["id"], *admin)
    assert code == 0
    assert f"created for tenant {tenant['id']}" in out and "export DLAAS_API_KEY=dlaas_" in out
    code, out, _ = run(capsys, "tenants", "keys", "create", tenant["id"], *admin, "--json")
    created = json.loads(out)
    assert code == 0 and created["api_key"].startswith(created["prefix"])

    code, out, _ = run(capsys, "tenants", "keys", "list", tenant["id"], *admin, "--json")
    listed = json.loads(out)
    assert code == 0 and len(listed) == 3
    assert all(set(k) == {"id", "prefix", "created", "last_used", "revoked"} for k in listed)
    first = listed[0]
    assert tenant["api_key"].startswith(first["prefix"])

    code, out, _ = run(capsys, "tenants", "keys", "revoke", tenant["id"], first["id"], *admin)
    assert code == 0 and f"Revoked API key {first['id']}" in out
    code, out, _ = run(capsys, "tenants", "keys", "list", tenant["id"], *admin)
    assert code == 0
    assert "ID" in out and "PREFIX" in out and "LAST USED" in out and "REVOKED" in out
    rows = {line.split()[0]: line.split() for line in out.splitlines()[1:]}
    assert rows[first["id"]][1] == first["prefix"]
    assert rows[first["id"]][-1] != "-" and rows[created["id"]][-1] == "-"  # revoked: when
    assert tenant["api_key"] not in out and created["api_key"] not in out

    # The revoked key is refused.
    code, _, err = run(capsys, "--api-key", tenant["api_key"], "list")
    assert code == 1 and "HTTP 401" in err


@pytest.mark.usefixtures("against_app")
def test_a_tenant_manages_its_own_keys_with_its_own_key(
    capsys: pytest.CaptureFixture[str],
) -> None:
    mine, other = new_tenant(capsys, "mine"), new_tenant(capsys, "other")
    as_me = ("--api-key", mine["api_key"])
    code, out, _ = run(capsys, *as_me, "tenants", "keys", "create", mine["id"], "--json")
    assert code == 0
    new = json.loads(out)
    code, out, _ = run(capsys, *as_me, "tenants", "keys", "list", mine["id"], "--json")
    assert code == 0 and [k["id"] for k in json.loads(out)][-1] == new["id"]
    # Another tenant's keys are not found, in words and, with --json, as the problem.
    code, out, err = run(capsys, *as_me, "tenants", "keys", "list", other["id"])
    assert code == 1 and out == "" and "Not found (HTTP 404)" in err
    code, out, err = run(
        capsys, *as_me, "tenants", "keys", "revoke", mine["id"], "nosuchkey", "--json"
    )
    assert code == 1 and json.loads(out)["status"] == 404 and "nosuchkey" in err


@pytest.mark.parametrize(
    ("code", "shown"),
    [(None, "-"), (0, "0"), (3, "3"), (-15, "-15 (SIGTERM)"), (-9, "-9 (SIGKILL)")],
)
def test_show_names_the_signal_that_ended_a_learner(code: int | None, shown: str) -> None:
    assert cli._exit_code(code) == shown


@pytest.mark.usefixtures("against_app")
def test_usage_prints_the_use_against_the_plan(capsys: pytest.CaptureFixture[str]) -> None:
    tenant = new_tenant(capsys, "small")
    key = ("--api-key", tenant["api_key"])
    code, out, _ = run(capsys, *key, "usage", "--json")
    assert code == 0
    usage = json.loads(out)
    lite = DEFAULT_CATALOG.plans["lite"]
    assert usage["plan"] == "lite"
    assert usage["queued_trainings"] == {"used": 0, "limit": lite.max_queued_trainings}
    code, out, _ = run(capsys, *key, "usage")
    assert code == 0 and "Plan: lite" in out
    lines = [" ".join(line.split()) for line in out.splitlines()]
    assert f"queued trainings 0 {lite.max_queued_trainings}" in lines
    assert f"deployments 0 {lite.max_deployments}" in lines
    assert f"max_runtime maximum (s) {lite.max_max_runtime}" in lines


def test_show_prints_the_attempt_and_every_attempt_before_it(
    capsys: pytest.CaptureFixture[str],
) -> None:
    from dlaas.models import Training

    at = "2026-01-01T12:00:00Z"
    training = Training.from_json(
        {
            "id": "t1",
            "name": "resumed",
            "status": "COMPLETED",
            "status_message": None,
            "framework": {"name": "tensorflow", "version": "2.21"},
            "compute_configuration": {"name": "P100", "nodes": 2},
            "learners": [
                {"learner_id": 1, "status": "COMPLETED", "exit_code": 0},
                {"learner_id": 2, "status": "COMPLETED", "exit_code": 0},
            ],
            "attempt": 2,
            "past_attempts": [
                {
                    "attempt": 1,
                    "started_at": at,
                    "ended_at": at,
                    "message": "attempt 1 of 2 failed: learner 2 was lost",
                    "learners": [
                        {"learner_id": 1, "status": "HALTED", "exit_code": -15},
                        {"learner_id": 2, "status": "LOST", "exit_code": None},
                    ],
                }
            ],
            "status_history": [
                {"status": "RUNNING", "at": at, "attempt": 1},
                {"status": "PENDING", "at": at, "attempt": 2, "message": "retrying"},
                {"status": "COMPLETED", "at": at, "attempt": 2},
            ],
            "created_at": at,
        }
    )
    cli._show_training(training)
    out = capsys.readouterr().out
    lines = [" ".join(line.split()) for line in out.splitlines()]
    assert "attempt 2" in lines
    assert any(line.startswith("Attempt 1 (ended") for line in lines)
    assert "attempt 1 of 2 failed: learner 2 was lost" in out
    assert "2 LOST -" in lines and "1 HALTED -15 (SIGTERM)" in lines
    # The history says which attempt each entry belongs to.
    assert any(line.endswith("2 PENDING retrying") for line in lines)
