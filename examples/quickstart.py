"""The user's journey on the embedded platform, as far as this version goes.

Starts `dlaas up` on a temporary DLAAS_HOME, creates a tenant with the admin key, submits
manifests/01-tensorflow-single.yaml with the code in examples/hello, reads the training
back, and shuts the platform down. Run it with `make quickstart`.
"""

from __future__ import annotations

import io
import json
import os
import socket
import subprocess
import sys
import tempfile
import time
import zipfile
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parents[1]


def step(message: str) -> None:
    print(f"==> {message}", flush=True)


def zip_dir(path: Path) -> bytes:
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w", zipfile.ZIP_DEFLATED) as z:
        for file in sorted(path.rglob("*")):
            if file.is_file():
                z.write(file, file.relative_to(path).as_posix())
    return buf.getvalue()


def main() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    home = Path(tempfile.mkdtemp(prefix="dlaas-quickstart-"))
    env = {**os.environ, "DLAAS_HOME": str(home)}
    url = f"http://127.0.0.1:{port}"
    step(f"starting the platform: dlaas up --port {port}  (DLAAS_HOME={home})")
    server = subprocess.Popen(
        [str(Path(sys.executable).with_name("dlaas")), "up", "--port", str(port)], env=env
    )
    try:
        for _ in range(600):
            try:
                if httpx.get(f"{url}/healthz").status_code == 200:
                    break
            except httpx.TransportError:
                time.sleep(0.1)
        else:
            raise SystemExit("the platform did not start")
        admin = {"Authorization": f"Bearer {(home / 'admin_api_key').read_text().strip()}"}
        step("creating tenant 'quickstart' on the standard plan")
        r = httpx.post(
            f"{url}/v1/tenants", json={"name": "quickstart", "plan": "standard"}, headers=admin
        )
        r.raise_for_status()
        me = {"Authorization": f"Bearer {r.json()['api_key']}"}
        manifest = ROOT / "manifests" / "01-tensorflow-single.yaml"
        step(f"submitting {manifest.relative_to(ROOT)} with the code in examples/hello")
        r = httpx.post(
            f"{url}/v1/trainings",
            files={
                "manifest": (manifest.name, manifest.read_bytes()),
                "model_definition": ("code.zip", zip_dir(ROOT / "examples" / "hello")),
            },
            headers=me,
        )
        if r.status_code != 201:
            raise SystemExit(f"refused: {r.text}")
        training = r.json()
        step(f"training {training['id']} accepted")
        print(json.dumps(training, indent=2))
        step("a manifest that breaks a rule is refused with the field named:")
        bad = manifest.read_text().replace("nodes: 1", "nodes: 0")
        r = httpx.post(
            f"{url}/v1/trainings",
            files={
                "manifest": ("bad.yaml", bad),
                "model_definition": ("c.zip", zip_dir(ROOT / "examples" / "hello")),
            },
            headers=me,
        )
        print(r.status_code, json.dumps(r.json()["errors"]))
        step(
            "this version accepts, validates, stores and queues trainings; "
            "learners are not started yet (no execution worker in this version)"
        )
        return 0
    finally:
        server.terminate()
        server.wait(timeout=30)


if __name__ == "__main__":
    sys.exit(main())
