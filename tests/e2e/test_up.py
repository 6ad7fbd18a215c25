"""`dlaas up` as a user runs it: a subprocess on the embedded defaults, driven over HTTP."""

from __future__ import annotations

import os
import signal
import socket
import stat
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from tests.conftest import CODE_ZIP, manifest_yaml

pytestmark = pytest.mark.e2e


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


@pytest.fixture
def dlaas_up(tmp_path: Path) -> Iterator[tuple[str, Path, subprocess.Popen[str]]]:
    port = _free_port()
    home = tmp_path / "home"
    env = {k: v for k, v in os.environ.items() if not k.startswith("DLAAS_")}
    env["DLAAS_HOME"] = str(home)
    dlaas = Path(sys.executable).with_name("dlaas")
    proc = subprocess.Popen(
        [str(dlaas), "up", "--port", str(port)],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        try:
            if httpx.get(f"{url}/healthz").status_code == 200:
                break
        except httpx.TransportError:
            time.sleep(0.1)
    else:
        proc.kill()
        pytest.fail(f"dlaas up did not become healthy:\n{proc.communicate()[0]}")
    try:
        yield url, home, proc
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def test_dlaas_up_serves_the_api_on_embedded_defaults(
    dlaas_up: tuple[str, Path, subprocess.Popen[str]],
) -> None:
    url, home, proc = dlaas_up
    key_file = home / "admin_api_key"
    assert stat.S_IMODE(key_file.stat().st_mode) == 0o600
    admin = {"Authorization": f"Bearer {key_file.read_text().strip()}"}
    r = httpx.post(f"{url}/v1/tenants", json={"name": "me", "plan": "standard"}, headers=admin)
    assert r.status_code == 201, r.text
    me = {"Authorization": f"Bearer {r.json()['api_key']}"}
    r = httpx.post(
        f"{url}/v1/trainings",
        files={"manifest": ("m.yaml", manifest_yaml()), "model_definition": ("c.zip", CODE_ZIP)},
        headers=me,
    )
    assert r.status_code == 201, r.text
    training = r.json()["id"]
    assert (home / "dlaas.db").is_file()
    assert (home / "objects" / "trainings" / training / "model_definition.zip").is_file()
    assert httpx.get(f"{url}/readyz").status_code == 200

    proc.send_signal(signal.SIGINT)
    out, _ = proc.communicate(timeout=30)
    assert proc.returncode == 0, out
    assert f"{url}" in out and str(key_file) in out
