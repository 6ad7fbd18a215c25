"""Every method of `dlaas.Client` and every error mapping, against the real app."""

from __future__ import annotations

import io
import json
import os
import subprocess
import sys
import tarfile
import threading
import time
import zipfile
from pathlib import Path
from typing import Any

import httpx
import pytest

from dlaas import (
    ApiKey,
    Client,
    Conflict,
    ConnectionFailed,
    Forbidden,
    NotFound,
    PayloadTooLarge,
    RateLimited,
    ServerError,
    Unauthorized,
    Use,
    ValidationError,
    WaitTimeout,
)
from dlaas.config import ClientConfig, config_path, load_config, write_config
from dlaas.errors import ApiError, BadRequest, DlaasError, error_from_response
from service.db.models import Training as TrainingRow
from service.domain.catalog import DEFAULT_CATALOG
from service.domain.metrics import LogMetricExtractor
from service.domain.states import TrainingState
from service.logs.base import LogRecord
from service.platform import Platform
from service.storage import keys
from service.trainings import record_transition
from tests.client.conftest import ClientFactory

ROOT = Path(__file__).resolve().parents[2]
ENV_CODE = ROOT / "examples" / "env"


def manifest(**overrides: Any) -> dict[str, Any]:
    doc: dict[str, Any] = {
        "name": "client-test",
        "framework": {"name": "tensorflow", "version": "2.21", "command": "python3 slow.py"},
        "compute_configuration": {"name": "K80", "nodes": 1},
        "evaluation_metrics": [{"name": "loss", "regex": r"loss=([0-9.eE+-]+)"}],
    }
    doc.update(overrides)
    return doc


def zip_bytes(files: dict[str, str]) -> bytes:
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w") as z:
        for name, text in files.items():
            z.writestr(name, text)
    return buf.getvalue()


def tar_gz_bytes(files: dict[str, str]) -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz") as t:
        for name, text in files.items():
            data = text.encode()
            info = tarfile.TarInfo(name)
            info.size = len(data)
            t.addfile(info, io.BytesIO(data))
    return buf.getvalue()


def move(platform: Platform, training_id: str, state: TrainingState) -> None:
    """Do what the worker and monitor would: record a state."""
    with platform.sessions() as session:
        row = session.get(TrainingRow, training_id)
        assert row is not None
        record_transition(row, state, f"test moved it to {state}")
        session.commit()


# -- importing ------------------------------------------------------------------------------


def test_the_client_imports_without_the_server() -> None:
    code = (
        "import sys, dlaas, dlaas.client, dlaas.errors, dlaas.models, dlaas.config;"
        "heavy = [m for m in ('service', 'worker', 'sqlalchemy', 'fastapi', 'celery',"
        " 'starlette', 'alembic') if m in sys.modules];"
        "print(','.join(heavy))"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=ROOT
    )
    assert out.stdout.strip() == ""


def test_the_cli_module_imports_without_the_server() -> None:
    code = (
        "import sys, dlaas.cli;"
        "print(','.join(m for m in ('service', 'worker', 'sqlalchemy', 'fastapi')"
        " if m in sys.modules))"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=ROOT
    )
    assert out.stdout.strip() == ""


# -- tenants --------------------------------------------------------------------------------


def test_tenants_create_and_list(admin: Client) -> None:
    tenant = admin.tenants.create("team-a", "lite")
    assert (tenant.name, tenant.plan) == ("team-a", "lite")
    assert tenant.api_key and tenant.api_key.startswith("dlaas_")
    assert tenant.created_at is not None
    listed = admin.tenants.list()
    assert [t.name for t in listed] == ["team-a"]
    assert listed[0].api_key is None  # shown once


def test_tenant_errors_are_typed(admin: Client, make_client: ClientFactory) -> None:
    tenant = admin.tenants.create("dup", "standard")
    with pytest.raises(Conflict) as conflict:
        admin.tenants.create("dup", "standard")
    assert conflict.value.status == 409 and "already exists" in conflict.value.detail
    with pytest.raises(ValidationError) as invalid:
        admin.tenants.create("other", "platinum")
    assert invalid.value.fields == ["plan"]
    assert "unknown plan 'platinum'" in invalid.value.errors[0].message
    with pytest.raises(Forbidden):
        make_client(tenant.api_key).tenants.list()
    with pytest.raises(Unauthorized) as bad_key:
        make_client("dlaas_not-a-key").tenants.list()
    assert bad_key.value.status == 401


def test_a_tenant_rotates_its_key_through_the_client(
    admin: Client, make_client: ClientFactory
) -> None:
    tenant = admin.tenants.create("rotating", "lite")
    assert tenant.api_key
    old = make_client(tenant.api_key)
    new_key = old.tenants.create_key(tenant.id)
    assert isinstance(new_key, ApiKey) and new_key.valid
    assert new_key.api_key and new_key.api_key.startswith(new_key.prefix)
    assert new_key.created is not None and new_key.last_used is None
    new = make_client(new_key.api_key)
    listed = new.tenants.list_keys(tenant.id)
    assert [k.id for k in listed][-1] == new_key.id and len(listed) == 2
    assert all(k.api_key is None for k in listed)  # shown once
    first = next(k for k in listed if tenant.api_key.startswith(k.prefix))
    new.tenants.revoke_key(tenant.id, first.id)
    with pytest.raises(Unauthorized):
        old.trainings.list()
    assert new.trainings.list() == []
    by_admin = {k.id: k for k in admin.tenants.list_keys(tenant.id)}
    assert not by_admin[first.id].valid and by_admin[first.id].revoked is not None
    assert by_admin[new_key.id].valid


def test_key_errors_are_typed(admin: Client, make_client: ClientFactory) -> None:
    alice = admin.tenants.create("alice", "lite")
    bob = admin.tenants.create("bob", "lite")
    as_alice = make_client(alice.api_key)
    for call in (
        lambda: as_alice.tenants.list_keys(bob.id),
        lambda: as_alice.tenants.create_key(bob.id),
        lambda: as_alice.tenants.revoke_key(alice.id, "nosuchkey"),
        lambda: admin.tenants.list_keys("nosuchtenant"),
    ):
        with pytest.raises(NotFound):
            call()
    with pytest.raises(Unauthorized):
        make_client("dlaas_not-a-key").tenants.list_keys(alice.id)


def test_no_key_says_how_to_get_one(make_client: ClientFactory) -> None:
    with pytest.raises(Unauthorized) as e:
        make_client().trainings.list()
    assert "DLAAS_API_KEY" in e.value.message and "dlaas up" in e.value.message


# -- trainings: submit ----------------------------------------------------------------------


def test_create_from_a_dict_and_a_directory(me: Client, platform: Platform) -> None:
    seen: list[tuple[int, int | None]] = []
    training = me.trainings.create(
        manifest(), ENV_CODE, progress=lambda done, total: seen.append((done, total))
    )
    assert training.status == "QUEUED" and not training.terminal
    assert training.name == "client-test"
    assert (training.framework.name, training.framework.version) == ("tensorflow", "2.21")
    assert (training.compute_configuration.name, training.compute_configuration.nodes) == (
        "K80",
        1,
    )
    assert [lr.learner_id for lr in training.learners] == [1]
    assert [e.status for e in training.status_history] == ["QUEUED"]
    assert training.raw["id"] == training.id
    assert seen and seen[-1][0] == seen[-1][1]  # the whole archive went up
    stored = platform.store.list(f"trainings/{training.id}/")
    [archive] = [i for i in stored if "model_definition" in i.key]
    with platform.store.open(archive.key) as f, zipfile.ZipFile(io.BytesIO(f.read())) as z:
        assert sorted(z.namelist()) == sorted(
            p.name for p in ENV_CODE.iterdir() if p.is_file() and p.suffix != ".pyc"
        )


def test_an_ffdl_manifest_through_the_client(me: Client) -> None:
    ffdl = {
        "name": "ffdl-style",
        "version": "1.0",
        "gpus": 1,
        "memory": "512MiB",
        "learners": 1,
        "framework": {"name": "tensorflow", "version": "1.5.0-gpu-py3", "command": "python3 x.py"},
    }
    training = me.trainings.create(ffdl, ENV_CODE)
    assert (training.framework.name, training.framework.version) == ("tensorflow", "1.5")
    assert training.compute_configuration.name == "K80"
    assert training.manifest["conventions"] == "ffdl"
    assert training.submitted_manifest == ffdl
    assert me.trainings.get(training.id).submitted_manifest == ffdl


def test_create_from_files_and_bytes(me: Client, tmp_path: Path) -> None:
    yaml_file = tmp_path / "m.yaml"
    yaml_file.write_text(
        "name: from-file\nframework: {name: tensorflow, version: '2.21', command: python3 t.py}\n"
        "compute_configuration: {name: K80, nodes: 1}\n"
    )
    zip_file = tmp_path / "code.zip"
    zip_file.write_bytes(zip_bytes({"t.py": "print(1)\n"}))
    assert me.trainings.create(yaml_file, zip_file).name == "from-file"
    tgz = tmp_path / "code.tar.gz"
    tgz.write_bytes(tar_gz_bytes({"t.py": "print(1)\n"}))
    assert me.trainings.create(str(yaml_file), str(tgz)).status == "QUEUED"
    assert me.trainings.create(manifest(), tar_gz_bytes({"t.py": "x"})).status == "QUEUED"
    assert me.trainings.create(manifest(), zip_bytes({"t.py": "x"})).status == "QUEUED"


def test_a_manifest_breaking_a_rule_names_the_field(admin: Client, make_client: Any) -> None:
    lite = make_client(admin.tenants.create("small", "lite").api_key)
    doc = manifest(compute_configuration={"name": "P100", "nodes": 2})
    with pytest.raises(ValidationError) as e:
        lite.trainings.create(doc, zip_bytes({"t.py": ""}))
    assert e.value.status == 422
    assert e.value.fields == ["/compute_configuration/nodes"]
    assert "lite plan" in e.value.errors[0].message
    assert e.value.problem["type"] == "urn:dlaas:problem:validation-failed"
    assert "/compute_configuration/nodes" in str(e.value)
    with pytest.raises(ValidationError) as typo:
        lite.trainings.create({**manifest(), "nodez": 3}, zip_bytes({"t.py": ""}))
    assert typo.value.fields == ["/nodez"]


def test_an_unsafe_archive_is_refused(me: Client) -> None:
    with pytest.raises(ValidationError) as e:
        me.trainings.create(manifest(), zip_bytes({"../escape.py": "x"}))
    assert e.value.fields == ["model_definition"]


def test_an_upload_above_the_limit_is_payload_too_large(me: Client) -> None:
    with pytest.raises(PayloadTooLarge) as e:
        me.trainings.create(manifest(), os.urandom(3 * 1024 * 1024))
    assert e.value.status == 413


def test_a_missing_manifest_file_is_an_os_error(me: Client, tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError):
        me.trainings.create(tmp_path / "nope.yaml", ENV_CODE)


# -- trainings: read ------------------------------------------------------------------------


def test_list_get_and_another_tenants_training(
    me: Client, admin: Client, make_client: ClientFactory, platform: Platform
) -> None:
    ids = [me.trainings.create(manifest(name=f"t{i}"), ENV_CODE).id for i in range(3)]
    assert [t.id for t in me.trainings.list()] == ids[::-1]  # newest first
    assert [t.id for t in me.trainings.list(limit=2)] == ids[:0:-1]
    move(platform, ids[0], TrainingState.HALTED)
    assert [t.id for t in me.trainings.list(status="HALTED")] == [ids[0]]
    with pytest.raises(ValidationError) as bad_status:
        me.trainings.list(status="SLEEPING")
    assert bad_status.value.fields == ["status"]
    got = me.trainings.get(ids[1])
    assert got.id == ids[1] and got.name == "t1"
    with pytest.raises(NotFound) as missing:
        me.trainings.get("nosuchtraining")
    assert "nosuchtraining" in missing.value.detail
    other = make_client(admin.tenants.create("other", "standard").api_key)
    with pytest.raises(NotFound):
        other.trainings.get(ids[1])
    assert other.trainings.list() == []


def test_list_follows_cursors(me: Client, monkeypatch: pytest.MonkeyPatch) -> None:
    ids = [me.trainings.create(manifest(name=f"p{i}"), ENV_CODE).id for i in range(3)]
    import dlaas.client

    real = dlaas.client.Client._json
    pages: list[Any] = []

    def spy(self: Client, method: str, path: str, **kwargs: Any) -> Any:
        if path == "/v1/trainings" and method == "GET":
            kwargs["params"]["limit"] = 1  # force one training per page
            pages.append(dict(kwargs["params"]))
        return real(self, method, path, **kwargs)

    monkeypatch.setattr(dlaas.client.Client, "_json", spy)
    assert [t.id for t in me.trainings.list()] == ids[::-1]
    assert len(pages) == 3 and "cursor" in pages[1]


def test_wait_returns_the_final_training(me: Client, platform: Platform) -> None:
    training = me.trainings.create(manifest(), ENV_CODE)
    with pytest.raises(WaitTimeout) as timeout:
        me.trainings.wait(training.id, timeout=0.3, poll_interval=0.05)
    assert isinstance(timeout.value, TimeoutError)
    assert timeout.value.last.status == "QUEUED"

    def finish() -> None:
        time.sleep(0.3)
        move(platform, training.id, TrainingState.RUNNING)
        move(platform, training.id, TrainingState.COMPLETED)

    threading.Thread(target=finish).start()
    done = me.trainings.wait(training.id, timeout=10, poll_interval=0.05)
    assert done.status == "COMPLETED" and done.succeeded and done.terminal
    assert [e.status for e in done.status_history] == ["QUEUED", "RUNNING", "COMPLETED"]
    assert done.started_at is not None and done.completed_at is not None
    with pytest.raises(NotFound):
        me.trainings.wait("nosuchtraining", timeout=1)


def test_logs_and_metrics(me: Client, platform: Platform) -> None:
    training = me.trainings.create(manifest(), ENV_CODE)
    now = time.time()
    platform.logs.append(
        training.id,
        [
            LogRecord(1, now - 10, "step=1 loss=0.5"),
            LogRecord(1, now - 5, "step=2 loss=0.25"),
            LogRecord(1, now, "done"),
        ],
    )
    platform.logs.append(training.id, [LogRecord(2, now, "worker two [not markup]")])
    lines = list(me.trainings.logs(training.id))
    assert len(lines) == 4 and all("[learner " in line for line in lines)
    assert any(line.endswith("[learner 1] step=2 loss=0.25") for line in lines)
    only_2 = list(me.trainings.logs(training.id, learner=2))
    assert [line.split(" ", 1)[1] for line in only_2] == ["[learner 2] worker two [not markup]"]
    recent = list(me.trainings.logs(training.id, since=now - 6))
    assert len(recent) == 3
    # The metrics are what learner 1's wrapper found in those lines as it wrote them.
    extractor = LogMetricExtractor([("loss", r"loss=([0-9.eE+-]+)")])
    extractor.feed(now - 10, "step=1 loss=0.5")
    extractor.feed(now - 5, "step=2 loss=0.25")
    document = json.dumps(extractor.document(1)).encode()
    key = keys.log_metrics_key(training.id, 1)
    platform.store.put_stream(key, io.BytesIO(document), len(document))
    metrics = me.trainings.metrics(training.id)
    assert [(p.value, p.step, p.learner) for p in metrics["loss"]] == [(0.5, 1, 1), (0.25, 2, 1)]
    assert metrics["loss"][0].timestamp.tzinfo is not None
    move(platform, training.id, TrainingState.COMPLETED)
    with me.trainings.logs(training.id, follow=True) as followed:
        assert len(list(followed)) == 4  # the training has ended: the stream ends
    with pytest.raises(NotFound):
        me.trainings.logs("nosuchtraining")
    with pytest.raises(BadRequest) as bad_since:
        me.trainings.logs(training.id, since="yesterday")
    assert bad_since.value.fields == ["since"]


def test_logs_read_without_follow_go_through_every_page(
    me: Client, platform: Platform, monkeypatch: pytest.MonkeyPatch
) -> None:
    import service.api.logs

    monkeypatch.setattr(service.api.logs, "PAGE_BYTES", 300)  # a few lines a page
    training = me.trainings.create(manifest(), ENV_CODE)
    records = [LogRecord(1 + i % 2, 1_700_000_000.0 + i, f"line {i}") for i in range(40)]
    platform.logs.append(training.id, records)
    assert list(me.trainings.logs(training.id)) == [r.render() for r in records]
    assert list(me.trainings.logs(training.id, learner=2)) == [
        r.render() for r in records if r.learner == 2
    ]


def test_stop_and_delete(me: Client, platform: Platform) -> None:
    queued = me.trainings.create(manifest(), ENV_CODE)
    stopped = me.trainings.stop(queued.id)
    assert stopped.status == "HALTED" and stopped.stop_requested
    assert me.trainings.stop(queued.id).status == "HALTED"  # idempotent
    done = me.trainings.create(manifest(), ENV_CODE)
    move(platform, done.id, TrainingState.COMPLETED)
    with pytest.raises(Conflict) as e:
        me.trainings.stop(done.id)
    assert "already COMPLETED" in e.value.detail
    me.trainings.delete(done.id)
    with pytest.raises(NotFound):
        me.trainings.get(done.id)
    with pytest.raises(NotFound):
        me.trainings.delete(done.id)
    assert platform.store.stat(f"trainings/{done.id}/model_definition.zip") is None


def test_results_download_and_model_definition(
    me: Client, platform: Platform, tmp_path: Path
) -> None:
    code = zip_bytes({"train.py": "print('hi')\n"})
    training = me.trainings.create(manifest(), code)
    prefix = f"trainings/{training.id}/results/"
    files = {
        "model/saved_model.pb": b"\x08\x01pb",
        "model/variables/variables.index": b"index",
        "learner-1/training-log.txt": b"line one\nline two\n",
        "metrics.json": b'{"loss": 0.1}',
    }
    for key, data in files.items():
        platform.store.put_stream(prefix + key, io.BytesIO(data), len(data))
    move(platform, training.id, TrainingState.COMPLETED)

    listed = {f.path: f.size for f in me.trainings.results(training.id)}
    assert listed == {k: len(v) for k, v in files.items()}

    seen: list[int] = []
    dest = tmp_path / "out"
    written = me.trainings.download(training.id, dest, progress=lambda d, t: seen.append(d))
    root = dest.resolve()
    assert written == sorted(root / k for k in files)
    for key, data in files.items():
        assert (dest / key).read_bytes() == data
    assert seen and seen == sorted(seen)

    archive = me.trainings.model_definition(training.id, tmp_path / "code" / "code.zip")
    assert archive.read_bytes() == code
    with pytest.raises(NotFound):
        me.trainings.download("nosuchtraining", tmp_path / "x")


def test_results_lists_every_page(me: Client, platform: Platform) -> None:
    """More files than one page of GET .../results holds (1,000): the client follows
    next_cursor and lists each once, in path order."""
    training = me.trainings.create(manifest(), ENV_CODE)
    prefix = f"trainings/{training.id}/results/"
    paths = [f"logs/{i % 3}/e{i:04d}" for i in range(2_100)]
    for path in paths:
        platform.store.put_stream(prefix + path, io.BytesIO(b"x"), 1)
    assert [f.path for f in me.trainings.results(training.id)] == sorted(paths)


# -- error mapping without a server ---------------------------------------------------------


def _response(status: int, body: bytes, **headers: str) -> httpx.Response:
    return httpx.Response(status, content=body, headers=headers)


def test_every_status_maps_to_its_error() -> None:
    problem = {"type": "urn:dlaas:problem:x", "title": "T", "status": 0, "detail": "d"}
    expected = {
        400: BadRequest,
        401: Unauthorized,
        403: Forbidden,
        404: NotFound,
        409: Conflict,
        413: PayloadTooLarge,
        422: ValidationError,
        429: RateLimited,
        500: ServerError,
        503: ServerError,
        418: ApiError,
    }
    for status, cls in expected.items():
        error = error_from_response(_response(status, json.dumps(problem).encode()))
        assert type(error) is cls, status
        assert isinstance(error, DlaasError)
        assert (error.status, error.title, error.detail, error.type) == (
            status,
            "T",
            "d",
            "urn:dlaas:problem:x",
        )


def test_rate_limited_carries_retry_after() -> None:
    body = {
        "type": "urn:dlaas:problem:too-many-requests",
        "title": "Too many requests",
        "status": 429,
        "detail": "the lite plan allows 500 predictions a minute",
    }
    error = error_from_response(_response(429, json.dumps(body).encode(), **{"Retry-After": "7"}))
    assert isinstance(error, RateLimited) and error.retry_after == 7.0
    assert "500 predictions" in str(error)


def test_a_non_problem_body_still_maps() -> None:
    error = error_from_response(_response(502, b"<html>bad gateway</html>"))
    assert isinstance(error, ServerError)
    assert error.detail == "<html>bad gateway</html>" and error.errors == []
    assert error.problem["status"] == 502


def test_an_unreachable_api_is_connection_failed() -> None:
    client = Client("http://127.0.0.1:9", "key", timeout=2)
    assert client.healthy() is False
    with pytest.raises(ConnectionFailed) as e:
        client.trainings.list()
    assert "http://127.0.0.1:9" in e.value.message and "dlaas up" in e.value.message
    client.close()


def test_healthy(make_client: ClientFactory) -> None:
    assert make_client().healthy() is True


# -- configuration --------------------------------------------------------------------------


def test_config_written_by_dlaas_up_is_the_fallback(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    for name in ("DLAAS_URL", "DLAAS_API_KEY", "DLAAS_CONFIG"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("DLAAS_HOME", str(tmp_path / "home"))
    assert Client().url == "http://127.0.0.1:8080" and Client().api_key is None
    path = write_config(ClientConfig("http://127.0.0.1:9999/", "dlaas_k", "local"))
    assert path == tmp_path / "home" / "client.json" == config_path()
    assert oct(path.stat().st_mode & 0o777) == "0o600"
    assert load_config() == ClientConfig("http://127.0.0.1:9999/", "dlaas_k", "local")
    client = Client()
    assert (client.url, client.api_key) == ("http://127.0.0.1:9999", "dlaas_k")
    # The environment wins; the configured key is never sent to another API.
    monkeypatch.setenv("DLAAS_URL", "http://elsewhere:8080")
    assert (Client().url, Client().api_key) == ("http://elsewhere:8080", None)
    monkeypatch.setenv("DLAAS_API_KEY", "dlaas_env")
    assert Client().api_key == "dlaas_env"
    assert Client("http://x:1", "dlaas_arg").api_key == "dlaas_arg"
    # DLAAS_CONFIG names another file.
    other = tmp_path / "elsewhere.json"
    monkeypatch.setenv("DLAAS_CONFIG", str(other))
    assert config_path() == other and load_config() is None
    other.write_text("not json")
    assert load_config() is None


# -- deployments ----------------------------------------------------------------------------


def saved_model(directory: Path) -> None:
    """A SavedModel computing y = x1 + 2 * x2 + 0.5 (input `x` float32 [None, 2])."""
    tf = pytest.importorskip("tensorflow", reason="install the tensorflow extra")

    class Linear(tf.Module):  # type: ignore[misc]
        def __init__(self) -> None:
            super().__init__()
            self.w = tf.Variable([[1.0], [2.0]])

        @tf.function(input_signature=[tf.TensorSpec([None, 2], tf.float32, name="x")])
        def serve(self, x: Any) -> dict[str, Any]:
            return {"y": tf.matmul(x, self.w) + 0.5}

    model = Linear()
    tf.saved_model.save(model, str(directory), signatures={"serving_default": model.serve})


def completed_training_with_model(client: Client, platform: Platform, tmp_path: Path) -> str:
    training = client.trainings.create(manifest(), zip_bytes({"t.py": ""}))
    model_dir = tmp_path / "model"
    saved_model(model_dir)
    for file in model_dir.rglob("*"):
        if file.is_file():
            key = f"trainings/{training.id}/results/model/{file.relative_to(model_dir)}"
            platform.store.put_file(key, file)
    move(platform, training.id, TrainingState.COMPLETED)
    return training.id


def test_deployments_create_wait_predict_delete(
    admin: Client, make_client: ClientFactory, platform: Platform, tmp_path: Path
) -> None:
    tenant = admin.tenants.create("scorer", "tiny")  # 2 predictions a minute
    me = make_client(tenant.api_key)
    training_id = completed_training_with_model(me, platform, tmp_path)

    deployment = me.deployments.create(training_id, name="linear")
    assert deployment.status == "DEPLOYING" and not deployment.final
    assert (deployment.training_id, deployment.name) == (training_id, "linear")
    ready = me.deployments.wait(deployment.id, timeout=60)
    assert ready.ready and ready.final and ready.status == "READY", ready
    assert me.deployments.get(deployment.id).status == "READY"
    assert [d.id for d in me.deployments.list()] == [deployment.id]

    predictions = me.deployments.predict(deployment.id, [[1.0, 2.0], [0.0, 0.0]])
    assert predictions == [[5.5], [0.5]]
    with pytest.raises(RateLimited) as limited:  # the third this minute
        me.deployments.predict(deployment.id, [[1.0, 1.0]])
    assert limited.value.retry_after is not None and limited.value.retry_after > 0

    me.deployments.delete(deployment.id)
    with pytest.raises(NotFound):
        me.deployments.get(deployment.id)
    with pytest.raises(NotFound):
        me.deployments.delete(deployment.id)


def test_deployment_errors(
    me: Client, platform: Platform, tmp_path: Path, admin: Client, make_client: ClientFactory
) -> None:
    queued = me.trainings.create(manifest(), zip_bytes({"t.py": ""}))
    with pytest.raises(Conflict):
        me.deployments.create(queued.id)
    move(platform, queued.id, TrainingState.COMPLETED)  # completed, but no SavedModel
    with pytest.raises(ValidationError):
        me.deployments.create(queued.id)
    with pytest.raises(NotFound):
        me.deployments.create("nosuchtraining")
    with pytest.raises(NotFound):
        me.deployments.predict("nosuchdeployment", [[1.0, 2.0]])

    training_id = completed_training_with_model(me, platform, tmp_path)
    deployment = me.deployments.wait(me.deployments.create(training_id).id, timeout=60)
    assert deployment.ready, deployment
    with pytest.raises(BadRequest) as bad_input:
        me.deployments.predict(deployment.id, [[1.0, 2.0, 3.0]])  # 3 values, not 2
    assert bad_input.value.errors, bad_input.value.problem
    other = make_client(admin.tenants.create("nosy", "standard").api_key)
    with pytest.raises(NotFound):
        other.deployments.get(deployment.id)
    with pytest.raises(WaitTimeout):
        other_training = completed_training_with_model(other, platform, tmp_path / "o")
        pending = other.deployments.create(other_training)
        other.deployments.wait(pending.id, timeout=0)


def test_usage_and_a_plan_limit_through_the_client(
    admin: Client, make_client: ClientFactory
) -> None:
    tenant = admin.tenants.create("small", "lite")
    assert tenant.api_key
    small = make_client(tenant.api_key)
    lite = DEFAULT_CATALOG.plans["lite"]
    usage = small.usage()
    assert (usage.tenant_id, usage.plan) == (tenant.id, "lite")
    assert usage.queued_trainings == Use(0, lite.max_queued_trainings)
    assert usage.deployments == Use(0, lite.max_deployments)
    assert usage.active_nodes == Use(0, lite.active_nodes_limit)
    assert (usage.default_max_runtime, usage.max_max_runtime) == (
        lite.default_max_runtime,
        lite.max_max_runtime,
    )
    first = small.trainings.create(manifest(name="t0"), ENV_CODE)
    assert first.max_runtime == lite.default_max_runtime
    for i in range(1, lite.max_queued_trainings):
        small.trainings.create(manifest(name=f"t{i}"), ENV_CODE)
    with pytest.raises(RateLimited) as refused:
        small.trainings.create(manifest(name="one-too-many"), ENV_CODE)
    assert refused.value.errors[0].field == "max_queued_trainings"
    assert f"allows {lite.max_queued_trainings} queued trainings" in refused.value.detail
    assert small.usage().queued_trainings.used == lite.max_queued_trainings
