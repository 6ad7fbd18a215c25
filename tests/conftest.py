"""Shared fixtures: a platform on SQLite and on PostgreSQL, an API client, tenants."""

from __future__ import annotations

import io
import os
import time
import zipfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest
from fastapi.testclient import TestClient
from sqlalchemy import text
from sqlalchemy.orm import Session

from service.api.app import create_app
from service.db.models import Base
from service.db.session import make_engine, upgrade
from service.platform import Platform
from service.scoring import ratelimit
from service.settings import Settings
from tests import leftovers, run_redis
from tests.leftovers import _leftovers_noted, pytest_configure  # noqa: F401 (the check's hooks)

ADMIN_KEY = "test-admin-key"
PG_SERVER = os.environ.get("DLAAS_TEST_POSTGRES", "postgresql+psycopg://postgres@127.0.0.1:5432")


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    run_redis.stop()  # this run's own Redis (tests/run_redis.py), then nothing may be left
    leftovers.check(session)


@pytest.fixture(scope="session")
def postgres_url() -> Iterator[str]:
    """A fresh PostgreSQL database for this test run, migrated from empty, dropped at the end."""
    name = f"dlaas_test_{os.getpid()}"
    admin_dsn = PG_SERVER.replace("postgresql+psycopg", "postgresql") + "/postgres"
    with psycopg.connect(admin_dsn, autocommit=True) as conn:
        conn.execute(f'DROP DATABASE IF EXISTS "{name}"')
        conn.execute(f'CREATE DATABASE "{name}"')
    url = f"{PG_SERVER}/{name}"
    engine = make_engine(url)
    upgrade(engine)
    engine.dispose()
    yield url
    with psycopg.connect(admin_dsn, autocommit=True) as conn:
        conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


@pytest.fixture(
    params=["sqlite", pytest.param("postgresql", marks=pytest.mark.integration)],
)
def database_url(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str]:
    if request.param == "sqlite":
        yield f"sqlite:///{tmp_path / 'dlaas.db'}"
        return
    url: str = request.getfixturevalue("postgres_url")
    engine = make_engine(url)
    with engine.begin() as conn:
        tables = ", ".join(t.name for t in Base.metadata.sorted_tables)
        conn.execute(text(f"TRUNCATE {tables} CASCADE"))
    engine.dispose()
    yield url


@pytest.fixture(params=["native", "python"])
def grpc_front(request: pytest.FixtureRequest) -> str:
    """Each transport of the scoring gRPC port (DLAAS_SCORING_GRPC_FRONT): the native
    front `make install` builds, and grpcio's server."""
    front: str = request.param
    return front


@pytest.fixture
def settings(tmp_path: Path, database_url: str) -> Settings:
    return Settings(
        home=tmp_path / "home",
        # Empty: only the platform's runtime is installed (tests/api/test_runtime_check.py).
        runtimes_dir=tmp_path / "runtimes",
        database_url=database_url,
        admin_api_key=ADMIN_KEY,
        max_upload_bytes=2 * 1024 * 1024,
        archive_max_files=50,
        archive_max_unpacked_bytes=1024 * 1024,
        # The data endpoint the tests' manifests name (none is allowed by default).
        allowed_data_endpoints="127.0.0.1:9000",
    )


@pytest.fixture
def platform(settings: Settings) -> Iterator[Platform]:
    p = Platform.from_settings(settings)
    yield p
    p.close()


@pytest.fixture
def session(platform: Platform) -> Iterator[Session]:
    """A session on the platform's migrated database."""
    platform.migrate()
    with platform.sessions() as s:
        yield s


class Slots:
    """A backend with `n` learner slots (all admission asks of it)."""

    def __init__(self, n: int) -> None:
        self.n = n

    def slots(self) -> int:
        return self.n


@pytest.fixture
def client(platform: Platform) -> Iterator[TestClient]:
    with TestClient(create_app(platform=platform), raise_server_exceptions=False) as c:
        yield c


def admin_headers() -> dict[str, str]:
    return {"Authorization": f"Bearer {ADMIN_KEY}"}


def create_tenant(client: TestClient, name: str, plan: str = "standard") -> dict[str, str]:
    """Create a tenant; returns the headers that authenticate as it."""
    r = client.post("/v1/tenants", json={"name": name, "plan": plan}, headers=admin_headers())
    assert r.status_code == 201, r.text
    return {"Authorization": f"Bearer {r.json()['api_key']}"}


@pytest.fixture
def tenant(client: TestClient) -> dict[str, str]:
    return create_tenant(client, "acme", "standard")


def zip_of(files: dict[str, str]) -> bytes:
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w") as z:
        for name, content in files.items():
            z.writestr(name, content)
    return buf.getvalue()


CODE_ZIP = zip_of({"train.py": "print('hello')\n"})


def manifest_yaml(**overrides: Any) -> str:
    """A valid single-node manifest, with top-level keys replaced by `overrides`."""
    import yaml

    doc: dict[str, Any] = {
        "name": "mnist",
        "framework": {"name": "tensorflow", "version": "2.21", "command": "python3 train.py"},
        "compute_configuration": {"name": "K80", "nodes": 1},
    }
    doc.update(overrides)
    return yaml.safe_dump(doc)


def submit(
    client: TestClient,
    headers: dict[str, str],
    manifest: str | bytes | None = None,
    code: bytes = CODE_ZIP,
    code_name: str = "code.zip",
) -> Any:
    return client.post(
        "/v1/trainings",
        files={
            "manifest": ("manifest.yaml", manifest if manifest is not None else manifest_yaml()),
            "model_definition": (code_name, code),
        },
        headers=headers,
    )


@pytest.fixture
def one_rate_window(monkeypatch: pytest.MonkeyPatch) -> None:
    """Prediction rate limits count in one window for the whole test (the one it starts
    in, with a minute left): a test that counts predictions over several requests must not
    see a minute boundary pass between two of them and the count start again."""
    window = int(time.time() // ratelimit.WINDOW_SECONDS)
    monkeypatch.setattr(ratelimit, "_window", lambda now: (window, ratelimit.WINDOW_SECONDS))
