"""The `dlaas` command line's failure reports, in-process: each invocation's options live in
its own typer context, so one command's --json never decides how the next one reports."""

from __future__ import annotations

import json
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import httpx
import pytest
import typer

from dlaas import cli
from dlaas.cli import app
from dlaas.client import Client
from service.domain.catalog import DEFAULT_CATALOG
from tests.client.conftest import SyncASGITransport
from tests.conftest import ADMIN_KEY, CODE_ZIP, manifest_yaml

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


def new_tenant(capsys: pytest.CaptureFixture[str], name: str, plan: str = "lite") -> dict[str, Any]:
    code, out, _ = run(
        capsys, "tenants", "create", name, "--plan", plan, "--admin-key", ADMIN_KEY, "--json"
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
    listed = json.loads(out)["items"]
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
    assert code == 0 and [k["id"] for k in json.loads(out)["items"]][-1] == new["id"]
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
    assert f"active learners 0 {lite.active_nodes_limit}" in lines
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


def test_show_says_why_a_learner_stopped_and_the_limits_once(
    capsys: pytest.CaptureFixture[str],
) -> None:
    from dlaas.models import Training

    at = "2026-01-01T12:00:00Z"
    note = "the memory limit (24 GiB) is enforced per process"
    training = Training.from_json(
        {
            "id": "t1",
            "name": "ps",
            "status": "COMPLETED",
            "status_message": None,
            "limits_note": note,
            "framework": {"name": "tensorflow", "version": "2.21"},
            "compute_configuration": {"name": "P100", "nodes": 3},
            "learners": [
                {
                    "learner_id": 1,
                    "status": "STOPPED",
                    "exit_code": -15,
                    "status_message": "the workers completed",
                },
                {"learner_id": 2, "status": "COMPLETED", "exit_code": 0},
                {"learner_id": 3, "status": "COMPLETED", "exit_code": 0},
            ],
            "status_history": [
                {"status": "RUNNING", "at": at},
                {"status": "COMPLETED", "at": at},
            ],
            "created_at": at,
        }
    )
    cli._show_training(training)
    out = capsys.readouterr().out
    lines = [" ".join(line.split()) for line in out.splitlines()]
    assert "status COMPLETED" in lines
    assert "1 STOPPED: the workers completed -15 (SIGTERM)" in lines
    assert out.count("enforced per process") == 1
    assert any(line.startswith("limits the memory limit (24 GiB)") for line in lines), out


def test_a_followed_training_ends_with_what_to_do_next() -> None:
    from dlaas.models import Training

    def ended(status: str) -> Training:
        return Training.from_json(
            {
                **training_document("t9", "n", status, "tensorflow", datetime.now(UTC)),
                "learners": [],
            }
        )

    steps = cli._next_steps(ended("COMPLETED"))
    assert any(step.endswith("dlaas deploy t9") for step in steps), steps
    assert any(step.endswith("dlaas download t9") for step in steps), steps
    failed = cli._next_steps(ended("FAILED"))
    assert any("dlaas logs t9" in step for step in failed), failed
    assert not any("deploy" in step for step in failed), failed


# -- what people read: lists on 80 columns, signatures, help; --json as the API answers ----


def served(monkeypatch: pytest.MonkeyPatch, documents: dict[str, Any]) -> None:
    """The CLI's clients get `documents[path]` as the API's JSON answer to each GET, on an
    80-column terminal."""

    def answer(request: httpx.Request) -> httpx.Response:
        return httpx.Response(200, json=documents[request.url.path])

    def client(url: str | None = None, api_key: str | None = None) -> Client:
        return Client("http://dlaas.test", api_key or "key", transport=httpx.MockTransport(answer))

    monkeypatch.setattr(cli, "Client", client)
    monkeypatch.setenv("COLUMNS", "80")


def training_document(
    training_id: str, name: str, status: str, framework: str, created: datetime
) -> dict[str, Any]:
    return {
        "id": training_id,
        "name": name,
        "status": status,
        "status_message": None,
        "framework": {"name": framework, "version": "2.21"},
        "compute_configuration": {"name": "P100", "nodes": 16},
        "learners": [],
        "status_history": [],
        "created_at": created.isoformat().replace("+00:00", "Z"),
    }


def test_list_fits_80_columns_one_line_a_training(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    now = datetime.now(UTC)
    rows = [  # id, name, status, framework, created ago, shown age
        (
            "k019qs1uj4ue",
            "a" * 70,
            "DOWNLOADING",
            "tensorflow-horovod",
            timedelta(days=412),
            "412d",
        ),
        (
            "etjgs5j8avsg",
            "mnist-" + "x" * 40,
            "COMPLETED",
            "tensorflow-ddl",
            timedelta(hours=5),
            "5h",
        ),
        ("zo7masqczqub", "short", "QUEUED", "tensorflow", timedelta(seconds=42), "42s"),
    ]
    page = {
        "items": [training_document(*row[:4], now - row[4]) for row in rows],
        "next_cursor": None,
    }
    served(monkeypatch, {"/v1/trainings": page})
    code, out, _ = run(capsys, "list")
    assert code == 0
    lines = out.splitlines()
    assert all(len(line) <= 80 for line in lines), out
    assert len(lines) == 1 + len(rows), out  # no row wrapped onto a second line
    assert lines[0].split() == ["ID", "NAME", "STATUS", "FRAMEWORK", "NODES", "AGE"]
    for line, (training_id, _, status, framework, _, age) in zip(lines[1:], rows, strict=True):
        assert line.startswith(training_id + " ")
        assert f" {status} " in line and f" {framework} 2.21 " in line  # never cut
        assert line.split()[-2:] == ["16", age]
    assert "…" in lines[1] and " short " in lines[3]  # a long name is cut, with an ellipsis


@pytest.mark.parametrize(
    ("ago", "shown"),
    [
        (timedelta(seconds=0), "0s"),
        (timedelta(seconds=59), "59s"),
        (timedelta(seconds=60), "1m"),
        (timedelta(minutes=119), "119m"),
        (timedelta(hours=2), "2h"),
        (timedelta(hours=47), "47h"),
        (timedelta(days=2), "2d"),
        (timedelta(days=999), "999d"),
        (timedelta(seconds=-5), "0s"),  # a clock a little ahead of ours
    ],
)
def test_ages_are_short(ago: timedelta, shown: str) -> None:
    now = datetime(2026, 11, 24, 12, 0, tzinfo=UTC)
    assert cli._age(now - ago, now) == shown
    assert cli._age(None, now) == "-"


def test_deployments_show_prints_the_signature(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """As the README's deployment answer: x float32 [null, 2] -> y float32 [null, 1]."""
    serving = {
        "inputs": [{"name": "x", "dtype": "float32", "shape": [None, 2]}],
        "outputs": [{"name": "y", "dtype": "float32", "shape": [None, 1]}],
    }
    tokens = {
        "inputs": [{"name": "ids", "dtype": "int64", "shape": None}],
        "outputs": [{"name": "scores", "dtype": "float32", "shape": [None]}],
    }
    document = {
        "id": "d1",
        "name": "linear",
        "training_id": "t1",
        "status": "READY",
        "status_message": None,
        "signature": serving,
        "signatures": {"serving_default": serving, "tokens": tokens},
        "predictions_url": "/v1/deployments/d1/predictions",
        "created_at": "2026-11-24T12:00:00Z",
        "updated_at": "2026-11-24T12:00:20Z",
        "ready_at": "2026-11-24T12:00:20Z",
    }
    served(monkeypatch, {"/v1/deployments/d1": document})
    code, out, _ = run(capsys, "deployments", "show", "d1")
    assert code == 0
    lines = [" ".join(line.split()) for line in out.splitlines()]
    assert "Deployment d1 (linear) of training t1: READY" in lines
    assert "Signature serving_default" in lines
    assert "NAME DTYPE SHAPE" in lines
    assert "input x float32 (None, 2)" in lines
    assert "output y float32 (None, 1)" in lines
    assert any(line.startswith("Other signatures") and line.endswith("tokens") for line in lines)

    code, out, _ = run(capsys, "deployments", "show", "d1", "--json")
    assert code == 0 and json.loads(out) == document


def every_command(group: Any, path: tuple[str, ...] = ()) -> Iterator[tuple[str, ...]]:
    yield path
    for name, command in getattr(group, "commands", {}).items():
        yield from every_command(command, (*path, name))


@pytest.mark.parametrize(
    "path", list(every_command(typer.main.get_command(app))), ids=lambda p: " ".join(p) or "dlaas"
)
def test_help_names_arguments_without_braces(
    capsys: pytest.CaptureFixture[str], path: tuple[str, ...]
) -> None:
    code, out, _ = run(capsys, *path, "--help")
    assert code == 0 and out.startswith(f"Usage: dlaas {' '.join(path)}".rstrip() + " ")
    assert "{" not in out and "}" not in out, out


def test_usage_lines_name_each_argument(capsys: pytest.CaptureFixture[str]) -> None:
    usage = {
        ("train",): "Usage: dlaas train [OPTIONS] MANIFEST CODE",
        ("download",): "Usage: dlaas download [OPTIONS] ID [DEST]",
        ("runtimes", "install"): "Usage: dlaas runtimes install [OPTIONS] [NAME]...",
        (
            "tenants",
            "keys",
            "revoke",
        ): "Usage: dlaas tenants keys revoke [OPTIONS] TENANT_ID KEY_ID",
    }
    for path, line in usage.items():
        code, out, _ = run(capsys, *path, "--help")
        assert code == 0 and out.splitlines()[0] == line


@pytest.mark.usefixtures("against_app")
def test_json_lists_are_the_api_answers(
    capsys: pytest.CaptureFixture[str], transport: SyncASGITransport, tmp_path: Path
) -> None:
    tenant = new_tenant(capsys, "lists")
    key = ("--api-key", tenant["api_key"])
    code_zip = tmp_path / "code.zip"
    code_zip.write_bytes(CODE_ZIP)
    for name in ("first", "second", "third"):
        manifest = tmp_path / f"{name}.yaml"
        manifest.write_text(manifest_yaml(name=name))
        code, _, _ = run(capsys, *key, "train", str(manifest), str(code_zip), "--json")
        assert code == 0

    def api(path: str, api_key: str, **params: Any) -> Any:
        with Client("http://dlaas.test", api_key, transport=transport) as client:
            return client._json("GET", path, params=params)

    code, out, _ = run(capsys, *key, "list", "--json")
    listed = json.loads(out)
    assert code == 0 and listed == api("/v1/trainings", tenant["api_key"])
    assert set(listed) == {"items", "next_cursor"} and listed["next_cursor"] is None
    assert [t["name"] for t in listed["items"]] == ["third", "second", "first"]

    # A page at a time: next_cursor goes on where --limit stopped.
    code, out, _ = run(capsys, *key, "list", "--limit", "2", "--json")
    first = json.loads(out)
    assert code == 0 and first == api("/v1/trainings", tenant["api_key"], limit=2)
    assert [t["name"] for t in first["items"]] == ["third", "second"] and first["next_cursor"]
    code, out, _ = run(capsys, *key, "list", "--cursor", first["next_cursor"], "--json")
    rest = json.loads(out)
    assert code == 0 and [t["name"] for t in rest["items"]] == ["first"]
    assert rest["next_cursor"] is None

    code, out, _ = run(capsys, *key, "deployments", "list", "--json")
    assert code == 0 and json.loads(out) == api("/v1/deployments", tenant["api_key"])
    admin = ("--admin-key", ADMIN_KEY)
    code, out, _ = run(capsys, "tenants", "list", *admin, "--json")
    assert code == 0 and json.loads(out) == api("/v1/tenants", ADMIN_KEY)
    code, out, _ = run(capsys, "tenants", "keys", "list", tenant["id"], *admin, "--json")
    keys = json.loads(out)
    assert code == 0 and keys == api(f"/v1/tenants/{tenant['id']}/keys", ADMIN_KEY)
    assert set(keys) == {"items"} and len(keys["items"]) == 1


def test_a_followed_training_says_what_it_waits_for_before_it_starts(
    capsys: pytest.CaptureFixture[str],
) -> None:
    # A Horovod training on `dlaas up` installs its runtime on its first use: --follow
    # shows that progress (the status message) until the training runs, then its logs.
    install = "installing the runtime 'horovod-tf2.14' on its first use"
    states = [
        ("QUEUED", None),
        ("PENDING", "starting 2 learner(s)"),
        ("PENDING", f"{install} (0m02s): Collecting absl-py"),
        ("PENDING", f"{install} (0m04s): Collecting absl-py"),
        ("PENDING", f"{install} (0m12s): Building wheel for horovod"),
        ("RUNNING", None),
    ]
    now = [0.0]

    class Trainings:
        def get(self, training_id: str) -> Any:
            from dlaas.models import Training

            status, message = states.pop(0)
            doc = training_document(training_id, "n", status, "tensorflow", datetime.now(UTC))
            return Training.from_json({**doc, "status_message": message})

    class FakeClient:
        trainings = Trainings()

    def sleep(seconds: float) -> None:
        now[0] += 2 * seconds

    cli._until_started(FakeClient(), "t1", every=1, quiet_for=10, clock=lambda: now[0], sleep=sleep)  # type: ignore[arg-type]
    said = [" ".join(line.split()) for line in capsys.readouterr().err.splitlines()]
    assert said == [
        "QUEUED",
        "PENDING starting 2 learner(s)",
        f"PENDING {install} (0m02s): Collecting absl-py",
        # (0m04s) is the same step 2 s later: not said again within 10 s
        f"PENDING {install} (0m12s): Building wheel for horovod",
    ]
    assert states == []  # it returned once the training ran


@pytest.mark.usefixtures("against_app")
def test_train_takes_a_kubeflow_job_file_as_it_is(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    """`dlaas train job.yaml code/`: the TFJob file is the manifest; a field the platform
    cannot carry is refused by name."""
    tenant = new_tenant(capsys, "kubeflow", plan="standard")
    key = ("--api-key", tenant["api_key"])
    code_zip = tmp_path / "code.zip"
    code_zip.write_bytes(CODE_ZIP)
    job = Path(__file__).resolve().parents[2] / "examples" / "kubeflow" / "tfjob-ps.yaml"
    code, out, _ = run(capsys, *key, "train", str(job), str(code_zip), "--json")
    assert code == 0
    training = json.loads(out)
    assert training["name"] == "ps-seed-tfjob"
    assert training["compute_configuration"] == {"name": "P100", "nodes": 3}

    with_volume = tmp_path / "tfjob.yaml"
    with_volume.write_text(
        job.read_text().replace(
            "          containers:\n",
            "          volumes: [{name: data, emptyDir: {}}]\n          containers:\n",
            1,
        )
    )
    code, _, err = run(capsys, *key, "train", str(with_volume), str(code_zip))
    assert code == 1
    assert "/spec/tfReplicaSpecs/PS/template/spec/volumes" in err
