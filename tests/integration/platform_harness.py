"""A whole platform for integration tests.

- `live_platform`: the API in process (driven over HTTP through TestClient), the monitor in
  a thread (or a subprocess), and a real Celery worker in a subprocess that a test can kill
  and restart.
- `process_platform`: every part its own process, as in a cluster: the API (uvicorn on a
  free port, driven over real HTTP), the Celery worker and the monitor, each in its own
  process group that a test can kill -9 and start again (tests/chaos).
"""

from __future__ import annotations

import io
import os
import random
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
import zipfile
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import yaml
from fastapi.testclient import TestClient

from service import runtimes
from service.api.app import create_app
from service.http.server import UVICORN_FLAGS
from service.platform import Platform
from service.settings import Settings
from worker.backends import make_backend
from worker.monitor import Monitor

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = ROOT / "examples"
ADMIN = "integration-admin-key"
TERMINAL = {"COMPLETED", "FAILED", "HALTED"}
# Where the tests' platforms find the framework runtimes: one directory shared by every
# run on this machine (DLAAS_RUNTIMES_DIR, default ~/.cache/dlaas/runtimes), so a runtime
# is built once per machine, not once per test run.
RUNTIMES_DIR = Path(os.environ.get("DLAAS_RUNTIMES_DIR") or "~/.cache/dlaas/runtimes").expanduser()


def ensure_runtime(name: str) -> runtimes.RuntimeInfo:
    """The runtime `name` in RUNTIMES_DIR, built there on first use (the Horovod runtime:
    about 1 to 2 minutes with pip's cache warm, up to 15 on a busy 2-core machine without)."""
    return runtimes.install(name, RUNTIMES_DIR, progress=lambda line: print(line, flush=True))


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


def spawn(argv: list[str], env: dict[str, str], log_path: Path) -> subprocess.Popen[bytes]:
    """A platform process in its own session (its own process group), output to `log_path`."""
    with open(log_path, "ab") as log:
        return subprocess.Popen(
            argv, env=env, stdout=log, stderr=log, cwd=ROOT, start_new_session=True
        )


def kill_group(proc: subprocess.Popen[bytes]) -> None:
    """SIGKILL the process group `proc` leads (it and whatever it started in it)."""
    if proc.poll() is None:
        with suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()


def settings_of(env: dict[str, str]) -> Settings:
    """The platform's Settings from the DLAAS_* variables of a platform process's `env`."""
    return Settings(
        **{k.removeprefix("DLAAS_").lower(): v for k, v in env.items() if k.startswith("DLAAS_")}
    )


def stop_learners(settings: Settings) -> None:
    """Stop what every training the platform's home holds still runs: its learners (by
    process group) and its learner network. A test's platform is killed at its end, and a
    training whose wrap-up had not run yet (stopped, failed, or still running) would
    otherwise keep its learners and network holder alive, detached, for ever."""
    if settings.backend != "local" or not settings.work_dir.is_dir():
        return
    backend = make_backend(settings)
    for training_id in backend.held():
        backend.stop(training_id)


def descendants(pid: int) -> list[int]:
    """The live processes below `pid` (children, theirs, ...), whatever group they lead."""
    children: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
        except (OSError, IndexError):
            continue
        if fields[0] not in ("Z", "X"):
            children.setdefault(int(fields[1]), []).append(int(entry.name))
    found, todo = [], [pid]
    while todo:
        for child in children.get(todo.pop(), []):
            found.append(child)
            todo.append(child)
    return found


def kill_tree(proc: subprocess.Popen[Any]) -> None:
    """SIGKILL `proc` and every process group below it (a supervised command leads a
    group of its own): what a container's end does to everything in it."""
    below = descendants(proc.pid)
    groups = set()
    for pid in below:
        with suppress(ProcessLookupError):
            groups.add(os.getpgid(pid))
    if proc.poll() is None:
        proc.kill()
    for pgid in groups - {os.getpgid(0)}:
        with suppress(ProcessLookupError, PermissionError):
            os.killpg(pgid, signal.SIGKILL)
    for pid in below:
        with suppress(ProcessLookupError, PermissionError):
            os.kill(pid, signal.SIGKILL)
    proc.wait()


def platform_env(home: Path, database_url: str, extra: dict[str, str]) -> dict[str, str]:
    """This process's environment without its DLAAS_* settings, plus the platform's."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("DLAAS_")}
    env.update(
        {
            "DLAAS_HOME": str(home),
            "DLAAS_DATABASE_URL": database_url,
            "DLAAS_ADMIN_API_KEY": ADMIN,
            "DLAAS_STOP_GRACE_SECONDS": "2",
            "DLAAS_MONITOR_INTERVAL": "0.1",
            "DLAAS_RUNTIMES_DIR": str(RUNTIMES_DIR),
            **extra,
        }
    )
    return env


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
        log = self.settings.home_dir / f"{module}.log"
        return spawn([sys.executable, "-m", module], self.env, log)

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
    env = platform_env(home, database_url, extra)
    settings = settings_of(env)
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
            stop_learners(settings)
            platform.close()


# -- every part its own process ----------------------------------------------------------

# HTTP answers that mean "this API process cannot answer now, ask again": it is being
# killed or restarted (a proxy would say 502/503), or a plan's limit holds for now (429).
RETRIED_STATUSES = {429, 502, 503, 504}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


@contextmanager
def private_redis(directory: Path) -> Iterator[str]:
    """A Redis server of the test's own (no persistence) on a free port; its URL."""
    server = shutil.which("redis-server") or "/usr/bin/redis-server"
    port = free_port()
    directory.mkdir(parents=True, exist_ok=True)
    argv = [server, "--port", str(port), "--bind", "127.0.0.1", "--save", ""]
    argv += ["--appendonly", "no", "--dir", str(directory)]
    proc = spawn(argv, dict(os.environ), directory / "redis.log")
    url = f"redis://127.0.0.1:{port}/0"
    try:
        deadline = time.monotonic() + 20
        while True:
            try:
                with socket.create_connection(("127.0.0.1", port), timeout=1):
                    break
            except OSError:
                if time.monotonic() > deadline or proc.poll() is not None:
                    raise AssertionError("the private redis-server did not start") from None
                time.sleep(0.05)
        yield url
    finally:
        kill_group(proc)


@contextmanager
def fresh_postgres_database(server: str, prefix: str) -> Iterator[str]:
    """A new, migrated PostgreSQL database `<prefix>_<random>` on `server` (a SQLAlchemy
    URL without a database); dropped at the end."""
    import psycopg

    from service.db.session import make_engine, upgrade

    name = f"{prefix}_{os.getpid()}_{random.randrange(16**8):08x}"
    admin_dsn = server.replace("postgresql+psycopg", "postgresql") + "/postgres"
    with psycopg.connect(admin_dsn, autocommit=True) as conn:
        conn.execute(f'CREATE DATABASE "{name}"')
    url = f"{server}/{name}"
    try:
        engine = make_engine(url)
        upgrade(engine)
        engine.dispose()
        yield url
    finally:
        with psycopg.connect(admin_dsn, autocommit=True) as conn:
            conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


class RetryingClient:
    """HTTP to an API process that may be down at any moment: every call is retried on a
    connection error or a RETRIED_STATUSES answer until `patience` seconds have passed.

    A retried POST may have been carried out before the connection broke (the API was
    killed between its commit and its answer): callers that must know name what they
    create uniquely and look it up afterwards."""

    def __init__(self, base_url: str, headers: dict[str, str], patience: float = 120) -> None:
        self.http = httpx.Client(base_url=base_url, headers=headers, timeout=30)
        self.patience = patience
        self.retries = 0

    def request(self, method: str, url: str, **kwargs: Any) -> httpx.Response:
        deadline = time.monotonic() + self.patience
        while True:
            try:
                r = self.http.request(method, url, **kwargs)
                if r.status_code not in RETRIED_STATUSES:
                    return r
                problem = f"{r.status_code} {r.text[:200]}"
            except httpx.TransportError as e:
                problem = f"{type(e).__name__}: {e}"
            if time.monotonic() > deadline:
                raise AssertionError(f"{method} {url}: no answer in {self.patience} s: {problem}")
            self.retries += 1
            time.sleep(0.2)

    def close(self) -> None:
        self.http.close()


PROCESS_KINDS = ("api", "worker", "monitor")


@dataclass
class ProcessPlatform:
    """The API, the worker and the monitor as separate processes on one environment."""

    home: Path
    env: dict[str, str]
    port: int
    procs: dict[str, subprocess.Popen[bytes]] = field(default_factory=dict)
    starts: dict[str, int] = field(default_factory=dict)
    client: RetryingClient | None = None

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def argv(self, kind: str) -> list[str]:
        if kind == "api":
            return [
                sys.executable,
                "-m",
                "uvicorn",
                "--factory",
                "service.api.app:create_app",
                "--host",
                "127.0.0.1",
                "--port",
                str(self.port),
                "--log-level",
                "warning",
                *UVICORN_FLAGS,
            ]
        return [sys.executable, "-m", {"worker": "worker", "monitor": "worker.monitor"}[kind]]

    def start(self, kind: str) -> None:
        assert kind not in self.procs or self.procs[kind].poll() is not None, kind
        self.procs[kind] = spawn(self.argv(kind), self.env, self.home / f"{kind}.log")
        self.starts[kind] = self.starts.get(kind, 0) + 1

    def kill(self, kind: str) -> None:
        """kill -9 the process group of `kind`."""
        kill_group(self.procs[kind])

    def running(self, kind: str) -> bool:
        return kind in self.procs and self.procs[kind].poll() is None

    def wait_api(self, timeout: float = 60) -> None:
        deadline = time.monotonic() + timeout
        while True:
            try:
                if httpx.get(f"{self.base_url}/readyz", timeout=5).status_code == 200:
                    return
            except httpx.TransportError:
                pass
            if time.monotonic() > deadline or not self.running("api"):
                log = (self.home / "api.log").read_text(errors="replace")[-3000:]
                raise AssertionError(f"the API did not start:\n{log}")
            time.sleep(0.1)

    def stop_all(self) -> None:
        for kind in PROCESS_KINDS:
            if kind in self.procs:
                self.kill(kind)

    def log_tail(self, kind: str, chars: int = 3000) -> str:
        try:
            return (self.home / f"{kind}.log").read_text(errors="replace")[-chars:]
        except OSError:
            return ""


@contextmanager
def process_platform(
    home: Path, database_url: str, redis_url: str, **extra: str
) -> Iterator[ProcessPlatform]:
    """The platform as separate processes on PostgreSQL `database_url` (migrated) and Redis
    `redis_url` (broker and log store); the client authenticates as a fresh tenant."""
    home.mkdir(parents=True, exist_ok=True)
    settings = {"DLAAS_BROKER_URL": redis_url, "DLAAS_LOG_STORE_URL": redis_url, **extra}
    env = platform_env(home, database_url, settings)
    live = ProcessPlatform(home=home, env=env, port=free_port())
    try:
        live.start("api")
        live.wait_api()
        admin = {"Authorization": f"Bearer {ADMIN}"}
        r = httpx.post(
            f"{live.base_url}/v1/tenants",
            json={"name": "chaos", "plan": "standard"},
            headers=admin,
            timeout=30,
        )
        assert r.status_code == 201, r.text
        headers = {"Authorization": f"Bearer {r.json()['api_key']}"}
        live.client = RetryingClient(live.base_url, headers)
        live.start("worker")
        live.start("monitor")
        yield live
    finally:
        if live.client is not None:
            live.client.close()
        live.stop_all()
        stop_learners(settings_of(env))
