"""DLAAS_HOME is owner-only: the directories the platform makes there 0700, the files that
hold secrets (database, admin key, secret key, logs) 0600, whatever the umask."""

from __future__ import annotations

import os
import stat
from collections.abc import Iterator
from pathlib import Path

import pytest
from fastapi.testclient import TestClient

from service.api.app import create_app
from service.logs.base import LogRecord
from service.platform import Platform
from service.private import narrow, private_dir
from service.settings import Settings
from tests.conftest import submit


def mode(path: Path) -> int:
    return stat.S_IMODE(os.stat(path).st_mode)


@pytest.fixture(autouse=True)
def usual_umask() -> Iterator[None]:
    """022, the usual default: what the platform does not set itself comes out 0755/0644."""
    previous = os.umask(0o022)
    yield
    os.umask(previous)


def test_a_platform_started_in_a_fresh_home_keeps_it_owner_only(tmp_path: Path) -> None:
    home = tmp_path / "fresh" / "home"
    # The embedded defaults: SQLite, the generated admin and secret keys, file logs.
    platform = Platform.from_settings(Settings(home=home, admin_api_key=None))
    try:
        with TestClient(create_app(platform=platform)) as client:
            admin = {"Authorization": f"Bearer {platform.admin_key}"}
            r = client.post("/v1/tenants", json={"name": "acme", "plan": "lite"}, headers=admin)
            tenant = {"Authorization": f"Bearer {r.json()['api_key']}"}
            training = submit(client, tenant).json()["id"]  # spooled, then stored
            platform.secrets.encrypt("a credential")  # the secret key, on first use
            platform.dispatcher  # noqa: B018 - the embedded broker's folder
            platform.logs.append(training, [LogRecord(0, 1.0, "hello")])
        assert mode(home) == 0o700
        assert mode(home.parent) == 0o700  # made by the platform too
        for name in ("dlaas.db", "admin_api_key", "secret_key"):
            assert mode(home / name) == 0o600, name
        for wal in home.glob("dlaas.db-*"):  # SQLite's -wal and -shm take the db's mode
            assert mode(wal) == 0o600, wal.name
        for name in ("logs", "objects", "broker"):
            assert mode(home / name) == 0o700, name
        assert mode(home / "logs" / training) == 0o700
        assert mode(home / "logs" / training / "learner-0.jsonl") == 0o600
        stored = [p for p in (home / "objects").rglob("*")]
        assert stored and all(mode(p) == (0o700 if p.is_dir() else 0o600) for p in stored)
    finally:
        platform.close()


def test_an_existing_home_is_narrowed_on_start(tmp_path: Path) -> None:
    home = tmp_path / "home"
    home.mkdir(mode=0o755)  # as an older version made it (umask 022)
    (home / "dlaas.db").touch()
    os.chmod(home / "dlaas.db", 0o644)  # an empty SQLite file, as an older version left it
    (home / "notes.txt").write_text("mine")
    platform = Platform.from_settings(Settings(home=home, admin_api_key="given"))
    try:
        platform.migrate()
        assert mode(home) == 0o700
        assert mode(home / "dlaas.db") == 0o600
        assert (home / "notes.txt").read_text() == "mine"  # nothing else touched
    finally:
        platform.close()


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to give a directory away")
def test_a_directory_of_another_user_is_left_alone(tmp_path: Path) -> None:
    shared = private_dir(tmp_path / "shared")
    os.chmod(shared, 0o755)  # noqa: S103 - a shared directory, on purpose
    os.chown(shared, 65534, 65534)
    narrow(shared, 0o700)
    assert mode(shared) == 0o755


def test_private_dir_makes_every_missing_level_0700(tmp_path: Path) -> None:
    os.chmod(tmp_path, 0o755)  # noqa: S103 - an ordinary parent, on purpose
    private_dir(tmp_path / "a" / "b" / "c")
    assert [mode(tmp_path / p) for p in ("a", "a/b", "a/b/c")] == [0o700] * 3
    assert mode(tmp_path) == 0o755  # an existing parent is not the platform's
