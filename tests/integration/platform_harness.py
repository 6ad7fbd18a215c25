"""A whole platform for integration tests: the API in process (driven over HTTP through
TestClient), the monitor in a thread, and a real Celery worker in a subprocess that a test
can kill and restart."""

from __future__ import annotations

import io
import os
import signal
import subprocess
import sys
import threading
import time
import zipfile
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml
from fastapi.testclient import TestClient

from service.api.app import create_app
from service.platform import Platform
from service.settings import Settings
from worker.backends import make_backend
from worker.monitor import Monitor

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = ROOT / "examples"
ADMIN = "integration-admin-key"
TERMINAL = {"COMPLETED", "FAILED", "HALTED"}


def zip_dir(path: Path) -> bytes:
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w") as z:
        for file in sorted(path.rglob("*")):
            if file.is_file() and "__pycache__" not in file.parts:
                z.write(file, file.relative_to(path).as_posix())
    return buf.getvalue()


def training_processes(training_id: str) -> list[int]:
    """Live processes that belong to the training (its wrappers or its commands)."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            stat = (entry / "stat").read_text()
            if stat.rsplit(")", 1)[1].split()[0] == "Z":
                continue
            environ = (entry / "environ").read_bytes()
            cmdline = (entry / "cmdline").read_bytes()
        except OSError:
            continue
        if f"TRAINING_ID={training_id}".encode() in environ.split(b"\0") or (
            f"/work/{training_id}/".encode() in cmdline
        ):
            found.append(int(entry.name))
    return found


@dataclass
class LivePlatform:
    settings: Settings
    platform: Platform
    client: TestClient
    env: dict[str, str]
    headers: dict[str, str] = field(default_factory=dict)
    worker: subprocess.Popen[bytes] | None = None
    monitor: subprocess.Popen[bytes] | None = None

    def _spawn(self, module: str) -> subprocess.Popen[bytes]:
        log = open(self.settings.home_dir / f"{module}.log", "ab")  # noqa: SIM115
        return subprocess.Popen(
            [sys.executable, "-m", module],
            env=self.env,
            stdout=log,
            stderr=log,
            cwd=ROOT,
            start_new_session=True,
        )

    def start_worker(self) -> None:
        self.worker = self._spawn("worker")

    def kill_worker(self) -> None:
        assert self.worker is not None
        os.killpg(self.worker.pid, signal.SIGKILL)
        self.worker.wait()

    def start_monitor(self) -> None:
        self.monitor = self._spawn("worker.monitor")

    def kill_monitor(self) -> None:
        assert self.monitor is not None
        os.killpg(self.monitor.pid, signal.SIGKILL)
        self.monitor.wait()

    def submit(self, manifest: dict[str, Any], code: Path | bytes) -> dict[str, Any]:
        archive = code if isinstance(code, bytes) else zip_dir(code)
        r = self.client.post(
            "/v1/trainings",
            files={
                "manifest": ("manifest.yaml", yaml.safe_dump(manifest)),
                "model_definition": ("code.zip", archive),
            },
            headers=self.headers,
        )
        assert r.status_code == 201, r.text
        body: dict[str, Any] = r.json()
        return body

    def get(self, training_id: str) -> dict[str, Any]:
        r = self.client.get(f"/v1/trainings/{training_id}", headers=self.headers)
        assert r.status_code == 200, r.text
        body: dict[str, Any] = r.json()
        return body

    def wait_for(self, training_id: str, states: set[str], timeout: float = 180) -> dict[str, Any]:
        deadline = time.monotonic() + timeout
        while True:
            t = self.get(training_id)
            if t["status"] in states:
                return t
            if time.monotonic() > deadline:
                worker_log = (self.settings.home_dir / "worker.log").read_text()[-3000:]
                raise AssertionError(f"{training_id} stuck in {t}\nworker log:\n{worker_log}")
            time.sleep(0.1)

    def logs(self, training_id: str, **params: Any) -> str:
        r = self.client.get(
            f"/v1/trainings/{training_id}/logs", params=params, headers=self.headers
        )
        assert r.status_code == 200, r.text
        return r.text

    def results(self, training_id: str) -> dict[str, bytes]:
        prefix = f"trainings/{training_id}/results/"
        out = {}
        for info in self.platform.store.list(prefix):
            with self.platform.store.open(info.key) as f:
                out[info.key[len(prefix) :]] = f.read()
        return out


@contextmanager
def live_platform(
    home: Path, database_url: str, *, monitor_process: bool = False, **extra: str
) -> Iterator[LivePlatform]:
    """The platform on `database_url`, with the DLAAS_* settings in `extra`; the monitor
    runs in a thread, or as a subprocess a test can kill with `monitor_process`."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("DLAAS_")}
    env.update(
        {
            "DLAAS_HOME": str(home),
            "DLAAS_DATABASE_URL": database_url,
            "DLAAS_ADMIN_API_KEY": ADMIN,
            "DLAAS_STOP_GRACE_SECONDS": "2",
            "DLAAS_MONITOR_INTERVAL": "0.1",
            **extra,
        }
    )
    settings = Settings(
        **{k.removeprefix("DLAAS_").lower(): v for k, v in env.items() if k.startswith("DLAAS_")}
    )
    platform = Platform.from_settings(settings)
    platform.migrate()
    stop = threading.Event()
    monitor = Monitor(platform, make_backend(settings))
    thread = threading.Thread(target=monitor.run, args=(stop,), daemon=True)
    with TestClient(create_app(platform=platform)) as client:
        live = LivePlatform(settings, platform, client, env)
        r = client.post(
            "/v1/tenants",
            json={"name": "integration", "plan": "standard"},
            headers={"Authorization": f"Bearer {ADMIN}"},
        )
        live.headers = {"Authorization": f"Bearer {r.json()['api_key']}"}
        live.start_worker()
        if monitor_process:
            live.start_monitor()
        else:
            thread.start()
        try:
            yield live
        finally:
            stop.set()
            if thread.is_alive():
                thread.join(timeout=10)
            for proc in (live.worker, live.monitor):
                if proc is not None and proc.poll() is None:
                    os.killpg(proc.pid, signal.SIGKILL)
                    proc.wait()
            platform.close()
