"""Long-lived objects are kept out of the garbage collector's full collections while a
server runs, and given back when it stops."""

from __future__ import annotations

import gc
from pathlib import Path

import pytest
from fastapi.testclient import TestClient

from service.api.app import create_app
from service.memory import settled
from service.settings import Settings


def test_settled_freezes_then_gives_back() -> None:
    gc.unfreeze()
    kept = [object() for _ in range(10)]
    with settled():
        assert gc.get_freeze_count() >= len(kept)
    assert gc.get_freeze_count() == 0


def test_the_api_runs_settled(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    gc.unfreeze()
    monkeypatch.setenv("DLAAS_ADMIN_API_KEY", "admin")
    app = create_app(Settings(home=tmp_path))
    with TestClient(app) as client:
        assert client.get("/healthz").status_code == 200
        # start-up done: the modules, the app and the platform are out of gc's way
        assert gc.get_freeze_count() > 10_000
    assert gc.get_freeze_count() == 0
