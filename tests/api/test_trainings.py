"""The trainings API: submit, read, list, stop, delete; archives; sizes; health."""

from __future__ import annotations

import io
import tarfile
from pathlib import Path

import pytest
from fastapi.testclient import TestClient
from sqlalchemy import text

from service.db.models import Training
from service.domain.states import TrainingState
from service.platform import Platform
from service.trainings import record_transition
from tests.conftest import create_tenant, manifest_yaml, submit, zip_of


def test_submit_and_read(client: TestClient, tenant: dict[str, str], platform: Platform) -> None:
    r = submit(client, tenant, manifest_yaml(compute_configuration={"name": "P100", "nodes": 3}))
    assert r.status_code == 201, r.text
    t = r.json()
    assert r.headers["location"] == f"/v1/trainings/{t['id']}"
    assert t["status"] == "QUEUED"
    assert t["framework"] == {"name": "tensorflow", "version": "2.21"}
    assert t["compute_configuration"] == {"name": "P100", "nodes": 3}
    assert [lr["learner_id"] for lr in t["learners"]] == [1, 2, 3]
    assert [h["status"] for h in t["status_history"]] == ["QUEUED"]
    assert t["started_at"] is None and t["completed_at"] is None
    assert client.get(f"/v1/trainings/{t['id']}", headers=tenant).json() == t
    stored = [o.key for o in platform.store.list(f"trainings/{t['id']}/")]
    assert stored == [f"trainings/{t['id']}/model_definition.zip"]


def test_read_shows_what_the_workers_recorded(
    client: TestClient, tenant: dict[str, str], platform: Platform
) -> None:
    """GET /v1/trainings/{id} reads with its own queries (no ORM objects): it shows what
    the list (ORM objects) shows, after transitions and learner updates."""
    r = submit(client, tenant, manifest_yaml(compute_configuration={"name": "P100", "nodes": 2}))
    training_id = r.json()["id"]
    with platform.sessions() as session:
        training = session.get(Training, training_id)
        assert training is not None
        for state in (TrainingState.PENDING, TrainingState.DOWNLOADING, TrainingState.RUNNING):
            record_transition(training, state, f"now {state}")
        training.learners[1].status = TrainingState.FAILED
        training.learners[1].exit_code = 3
        training.learners[1].status_message = "out of memory"
        training.limits_note = "the CPU limit (8) is not enforced"
        session.commit()
    shown = client.get(f"/v1/trainings/{training_id}", headers=tenant)
    assert shown.status_code == 200
    assert shown.headers["content-type"] == "application/json"
    t = shown.json()
    assert t == client.get("/v1/trainings", headers=tenant).json()["items"][0]
    assert [h["status"] for h in t["status_history"]] == [
        "QUEUED",
        "PENDING",
        "DOWNLOADING",
        "RUNNING",
    ]
    assert t["status_history"][-1]["message"] == "now RUNNING"
    assert t["status"] == "RUNNING" and t["started_at"] is not None
    assert t["learners"] == [
        {"learner_id": 1, "status": "QUEUED", "exit_code": None, "status_message": None},
        {"learner_id": 2, "status": "FAILED", "exit_code": 3, "status_message": "out of memory"},
    ]
    assert t["limits_note"] == "the CPU limit (8) is not enforced"
    other = create_tenant(client, "someone-else")
    assert client.get(f"/v1/trainings/{training_id}", headers=other).status_code == 404
    # A page holds each training with its own learners and history.
    three = submit(
        client, tenant, manifest_yaml(compute_configuration={"name": "P100", "nodes": 3})
    )
    items = client.get("/v1/trainings", headers=tenant).json()["items"]
    assert [(i["id"], len(i["learners"]), len(i["status_history"])) for i in items] == [
        (three.json()["id"], 3, 1),
        (training_id, 2, 4),
    ]
    assert items[1] == t


def test_tar_gz_archive_is_accepted(
    client: TestClient, tenant: dict[str, str], platform: Platform
) -> None:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz") as tar:
        data = b"print('hi')\n"
        info = tarfile.TarInfo("code/train.py")
        info.size = len(data)
        tar.addfile(info, io.BytesIO(data))
    r = submit(client, tenant, code=buf.getvalue(), code_name="code.tar.gz")
    assert r.status_code == 201, r.text
    assert platform.store.stat(f"trainings/{r.json()['id']}/model_definition.tar.gz") is not None


def test_unknown_training_is_404(client: TestClient, tenant: dict[str, str]) -> None:
    r = client.get("/v1/trainings/nosuchthing", headers=tenant)
    assert r.status_code == 404
    assert "nosuchthing" in r.json()["detail"]


def test_list_is_newest_first_paged_and_filtered(
    client: TestClient, tenant: dict[str, str]
) -> None:
    ids = [submit(client, tenant).json()["id"] for _ in range(5)]
    client.post(f"/v1/trainings/{ids[1]}/stop", headers=tenant)
    page = client.get("/v1/trainings?limit=2", headers=tenant).json()
    seen = [t["id"] for t in page["items"]]
    while page["next_cursor"]:
        page = client.get(
            f"/v1/trainings?limit=2&cursor={page['next_cursor']}", headers=tenant
        ).json()
        seen += [t["id"] for t in page["items"]]
    assert seen == list(reversed(ids))
    halted = client.get("/v1/trainings?status=HALTED", headers=tenant).json()["items"]
    assert [t["id"] for t in halted] == [ids[1]]
    queued = client.get("/v1/trainings?status=QUEUED", headers=tenant).json()["items"]
    assert len(queued) == 4


@pytest.mark.parametrize(
    ("query", "field"),
    [
        ("status=SLEEPING", "status"),
        ("limit=0", "limit"),
        ("limit=501", "limit"),
        ("cursor=garbage!", "cursor"),
    ],
)
def test_bad_list_queries(
    client: TestClient, tenant: dict[str, str], query: str, field: str
) -> None:
    r = client.get(f"/v1/trainings?{query}", headers=tenant)
    assert r.status_code in (400, 422)
    assert field in [e["field"] for e in r.json()["errors"]]


def test_stop_a_queued_training_halts_it(client: TestClient, tenant: dict[str, str]) -> None:
    tid = submit(client, tenant).json()["id"]
    r = client.post(f"/v1/trainings/{tid}/stop", headers=tenant)
    assert r.status_code == 200
    body = r.json()
    assert body["status"] == "HALTED" and body["completed_at"] is not None
    assert [h["status"] for h in body["status_history"]] == ["QUEUED", "HALTED"]
    assert {lr["status"] for lr in body["learners"]} == {"HALTED"}
    # Stopping again is harmless.
    assert client.post(f"/v1/trainings/{tid}/stop", headers=tenant).status_code == 200


def test_delete_removes_the_training_and_its_artifacts(
    client: TestClient, tenant: dict[str, str], platform: Platform
) -> None:
    tid = submit(client, tenant).json()["id"]
    assert client.delete(f"/v1/trainings/{tid}", headers=tenant).status_code == 204
    assert client.get(f"/v1/trainings/{tid}", headers=tenant).status_code == 404
    assert list(platform.store.list(f"trainings/{tid}/")) == []
    assert client.delete(f"/v1/trainings/{tid}", headers=tenant).status_code == 404


def test_upload_over_the_cap_is_413(client: TestClient, tenant: dict[str, str]) -> None:
    big = b"\0" * (3 * 1024 * 1024)  # the test settings cap bodies at 2 MiB
    r = submit(client, tenant, code=big)
    assert r.status_code == 413
    assert r.headers["content-type"] == "application/problem+json"
    assert client.get("/v1/trainings", headers=tenant).json()["items"] == []


def _evil_tar(name: str, *, link: str | None = None, kind: bytes = tarfile.REGTYPE) -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz") as tar:
        info = tarfile.TarInfo(name)
        info.type = kind
        if link is not None:
            info.linkname = link
        data = b"" if kind != tarfile.REGTYPE else b"pwned\n"
        info.size = len(data)
        tar.addfile(info, io.BytesIO(data))
    return buf.getvalue()


def _zip_bomb() -> bytes:
    buf = io.BytesIO()
    import zipfile

    with zipfile.ZipFile(buf, "w", zipfile.ZIP_DEFLATED) as z:
        z.writestr("bomb.bin", b"\0" * (8 * 1024 * 1024))
    return buf.getvalue()


@pytest.mark.parametrize(
    ("code", "name", "words"),
    [
        (zip_of({"../escape.py": "x"}), "code.zip", "../escape.py"),
        (zip_of({"/etc/cron.d/evil": "x"}), "code.zip", "/etc/cron.d/evil"),
        (_evil_tar("../../escape.py"), "code.tar.gz", "escape.py"),
        (_evil_tar("link", link="../../etc/passwd", kind=tarfile.SYMTYPE), "code.tar.gz", "link"),
        (_evil_tar("link", link="/etc/passwd", kind=tarfile.SYMTYPE), "code.tar.gz", "link"),
        (_evil_tar("hard", link="../outside", kind=tarfile.LNKTYPE), "code.tar.gz", "hard"),
        (_evil_tar("dev", kind=tarfile.CHRTYPE), "code.tar.gz", "dev"),
        (_zip_bomb(), "code.zip", ""),
        (zip_of({f"f{i}.py": "x" for i in range(60)}), "code.zip", "50"),
        (b"just some text, not an archive", "code.zip", ".zip or .tar.gz"),
    ],
    ids=[
        "dotdot",
        "absolute",
        "tar-dotdot",
        "symlink-up",
        "symlink-abs",
        "hardlink",
        "device",
        "zip-bomb",
        "too-many-files",
        "not-an-archive",
    ],
)
def test_unsafe_archives_are_refused(
    client: TestClient,
    tenant: dict[str, str],
    platform: Platform,
    tmp_path: Path,
    code: bytes,
    name: str,
    words: str,
) -> None:
    before = set(tmp_path.rglob("*"))
    r = submit(client, tenant, code=code, code_name=name)
    assert r.status_code == 422, r.text
    err = r.json()["errors"][0]
    assert err["field"] == "model_definition"
    assert words in err["message"]
    # Nothing stored, nothing written around it.
    assert list(platform.store.list("trainings/")) == []
    after = {p for p in tmp_path.rglob("*")}
    assert {
        p
        for p in after - before
        if "objects" not in p.parts and p.suffix not in (".db-wal", ".db-shm", ".db-journal")
    } == set()
    assert not (tmp_path / "escape.py").exists() and not Path("/etc/cron.d/evil").exists()
    assert client.get("/v1/trainings", headers=tenant).json()["items"] == []


def test_health_and_readiness(client: TestClient) -> None:
    assert client.get("/healthz").json() == {"status": "ok"}
    r = client.get("/readyz")
    assert r.status_code == 200 and r.json()["database"] == "ok"


def test_readiness_fails_when_the_database_is_gone(tmp_path: Path) -> None:
    from service.api.app import create_app
    from service.settings import Settings

    settings = Settings(
        home=tmp_path,
        admin_api_key="k",
        database_url="postgresql+psycopg://nobody@127.0.0.1:1/none",
        auto_migrate=False,
    )
    with TestClient(create_app(settings)) as c:
        r = c.get("/readyz")
    assert r.status_code == 503
    assert r.headers["content-type"] == "application/problem+json"


def test_openapi_has_stable_operation_ids(client: TestClient) -> None:
    spec = client.get("/openapi.json").json()
    ops = {op["operationId"] for path in spec["paths"].values() for op in path.values()}
    assert {
        "create_training",
        "list_trainings",
        "get_training",
        "stop_training",
        "delete_training",
        "create_tenant",
        "list_tenants",
        "create_tenant_key",
        "list_tenant_keys",
        "revoke_tenant_key",
        "healthz",
        "readyz",
    } <= ops
    assert client.get("/docs").status_code == 200


def test_unknown_route_is_problem_json(client: TestClient) -> None:
    r = client.get("/v1/nothing-here")
    assert r.status_code == 404
    assert r.headers["content-type"] == "application/problem+json"


def test_lite_plan_accepts_single_node(client: TestClient) -> None:
    lite = create_tenant(client, "student", "lite")
    assert submit(client, lite).status_code == 201


def test_reads_survive_the_database_dropping_connections(
    client: TestClient, tenant: dict[str, str], platform: Platform
) -> None:
    """GET /v1/trainings/{id} reads without pinging a pooled connection first (on a
    server database): a connection the server dropped (a restart, a failover) is retried
    once on a new one, so the client sees no error."""
    if platform.engine.dialect.name != "postgresql":
        pytest.skip("SQLite connections are files in this process; nothing drops them")
    first, training_id = (submit(client, tenant).json()["id"] for _ in range(2))
    # A pooled connection now; the training read after the drop was never read, so the
    # process keeps no body of it (service.api.training_views): its read is a query.
    assert client.get(f"/v1/trainings/{first}", headers=tenant).status_code == 200
    path = f"/v1/trainings/{training_id}"
    with platform.engine.connect() as conn:
        dropped = conn.execute(
            text(
                "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity "
                "WHERE datname = current_database() AND pid <> pg_backend_pid()"
            )
        ).scalar_one()
    assert dropped >= 1
    for _ in range(3):
        r = client.get(path, headers=tenant)
        assert r.status_code == 200, r.text
        assert r.json()["id"] == training_id


def test_a_submission_solves_no_generator_dependency() -> None:
    """FastAPI enters and leaves a generator dependency (a session's) in worker threads of
    its own: two more thread hops on every submission, the platform's busiest write. The
    route opens its session in its own thread."""
    import inspect

    from fastapi.routing import APIRoute

    from service.api.trainings import router

    route = next(
        r
        for r in router.routes
        if isinstance(r, APIRoute) and r.path == "/v1/trainings" and "POST" in r.methods
    )

    def calls(dependant: object) -> list[object]:
        found = []
        for dependency in getattr(dependant, "dependencies", []):
            found += [dependency.call, *calls(dependency)]
        return found

    generators = [c for c in calls(route.dependant) if inspect.isgeneratorfunction(c)]
    assert generators == []
