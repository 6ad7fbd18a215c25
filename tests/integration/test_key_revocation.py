"""A revoked key is refused on the next request through a second API process: real API
processes (`uvicorn service.api.app:create_app --factory`) on one database: two on
PostgreSQL, two on SQLite, and one alone on SQLite (the embedded platform)."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import ExitStack
from pathlib import Path

import httpx
import pytest

from service.http.server import UVICORN_FLAGS
from tests.conftest import ADMIN_KEY

ROOT = Path(__file__).resolve().parents[2]
ADMIN = {"Authorization": f"Bearer {ADMIN_KEY}"}

pytestmark = pytest.mark.integration


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


Start = Callable[[str, str], str]


@pytest.fixture
def start_api(tmp_path: Path) -> Iterator[Start]:
    """`start_api(name, database_url)`: an API process on that database; returns its URL."""
    with ExitStack() as stack:

        def start(name: str, database_url: str) -> str:
            env = {
                **os.environ,
                "PYTHONPATH": str(ROOT),
                "DLAAS_HOME": str(tmp_path / "home"),
                "DLAAS_DATABASE_URL": database_url,
                "DLAAS_ADMIN_API_KEY": ADMIN_KEY,
            }
            port = _free_port()
            log = stack.enter_context((tmp_path / f"{name}.log").open("ab"))
            proc = subprocess.Popen(
                [
                    sys.executable,
                    "-m",
                    "uvicorn",
                    "service.api.app:create_app",
                    "--factory",
                    "--host",
                    "127.0.0.1",
                    "--port",
                    str(port),
                    "--no-access-log",
                    *UVICORN_FLAGS,
                ],
                env=env,
                cwd=ROOT,
                stdout=log,
                stderr=log,
                start_new_session=True,
            )

            def stop() -> None:
                os.killpg(proc.pid, signal.SIGTERM)
                proc.wait(timeout=30)

            stack.callback(stop)
            url = f"http://127.0.0.1:{port}"
            deadline = time.monotonic() + 60
            while True:
                assert proc.poll() is None, (tmp_path / f"{name}.log").read_text()
                try:
                    if httpx.get(f"{url}/healthz").status_code == 200:
                        return url
                except httpx.TransportError:
                    pass
                assert time.monotonic() < deadline, f"API {name} did not start"
                time.sleep(0.1)

        yield start


def _tenant_key(api: httpx.Client) -> tuple[str, str, str]:
    """A new tenant's id, its key, and the key's id."""
    r = api.post("/v1/tenants", json={"name": "acme", "plan": "lite"}, headers=ADMIN)
    assert r.status_code == 201, r.text
    tenant_id, key = r.json()["id"], r.json()["api_key"]
    keys = api.get(f"/v1/tenants/{tenant_id}/keys", headers=ADMIN).json()["items"]
    return tenant_id, key, keys[0]["id"]


def _refused_within(api: httpx.Client, key: str, seconds: float) -> float:
    """Poll with `key` until the API answers 401; how long it took (fails after `seconds`)."""
    since = time.monotonic()
    while True:
        r = api.get("/v1/trainings", headers={"Authorization": f"Bearer {key}"})
        elapsed = time.monotonic() - since
        if r.status_code == 401:
            return elapsed
        assert r.status_code == 200, r.text
        assert elapsed < seconds, f"the revoked key still works after {elapsed:.2f} s"
        time.sleep(0.05)


def test_a_revoked_key_is_refused_on_the_next_request_through_a_second_api_process(
    start_api: Start, database_url: str
) -> None:
    with (
        httpx.Client(base_url=start_api("a", database_url)) as a,
        httpx.Client(base_url=start_api("b", database_url)) as b,
    ):
        tenant_id, key, key_id = _tenant_key(a)
        mine = {"Authorization": f"Bearer {key}"}
        for _ in range(3):  # B now remembers the key
            assert b.get("/v1/trainings", headers=mine).status_code == 200
        r = a.delete(f"/v1/tenants/{tenant_id}/keys/{key_id}", headers=ADMIN)
        assert r.status_code == 204
        _refused_within(b, key, 1.5)
        assert a.get("/v1/trainings", headers=mine).status_code == 401
        listed = b.get(f"/v1/tenants/{tenant_id}/keys", headers=ADMIN).json()["items"]
        assert listed[0]["revoked"] is not None


def test_a_revoked_key_is_refused_at_once_by_a_single_embedded_process(
    start_api: Start, tmp_path: Path
) -> None:
    embedded = f"sqlite:///{tmp_path / 'home' / 'dlaas.db'}"
    with httpx.Client(base_url=start_api("embedded", embedded)) as api:
        tenant_id, key, key_id = _tenant_key(api)
        mine = {"Authorization": f"Bearer {key}"}
        assert api.get("/v1/trainings", headers=mine).status_code == 200
        r = api.delete(f"/v1/tenants/{tenant_id}/keys/{key_id}", headers=mine)  # its own
        assert r.status_code == 204
        assert api.get("/v1/trainings", headers=mine).status_code == 401
