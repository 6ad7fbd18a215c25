"""`dlaas up` as a user runs it: a subprocess on the embedded defaults, driven over HTTP and
through the Python client; its shutdown on Ctrl-C and what the next start resumes."""

from __future__ import annotations

import json
import os
import signal
import socket
import stat
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import pytest
import redis
from sqlalchemy import text

from dlaas import Client
from service.db.models import Base
from service.db.session import make_engine
from tests import run_redis
from tests.conftest import CODE_ZIP, manifest_yaml
from tests.integration.platform_harness import settings_of, stop_learners, training_processes
from tests.integration.test_retries import TRAIN

pytestmark = pytest.mark.e2e

ROOT = Path(__file__).resolve().parents[2]
ENV_CODE = ROOT / "examples" / "env"
DLAAS = str(Path(sys.executable).with_name("dlaas"))


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def clean_env(home: Path, **extra: str) -> dict[str, str]:
    """The caller's environment without DLAAS_* settings, on `home`."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("DLAAS_")}
    env.update(DLAAS_HOME=str(home), DLAAS_STOP_GRACE_SECONDS="2", **extra)
    return env


@dataclass
class Up:
    """A running `dlaas up` subprocess; its output is collected as it comes."""

    url: str
    home: Path
    env: dict[str, str]
    proc: subprocess.Popen[str]
    lines: list[str] = field(default_factory=list)

    @property
    def output(self) -> str:
        return "".join(self.lines)

    def client(self) -> Client:
        """A client as the `local` tenant, from the config `dlaas up` wrote."""
        config = json.loads((self.home / "client.json").read_text())
        return Client(self.url, config["api_key"])

    def stop(self, sig: int = signal.SIGINT, timeout: float = 60) -> int:
        self.proc.send_signal(sig)
        return self.proc.wait(timeout=timeout)

    def kill(self) -> None:
        """SIGKILL `dlaas up`, then stop what its trainings still run (learners, networks)."""
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()
        if self.env.get("DLAAS_BACKEND", "local") == "local":
            stop_learners(settings_of(self.env))


def start_up(
    home: Path, port: int | None = None, *, options: tuple[str, ...] = (), **extra: str
) -> Up:
    """`dlaas up` on `home` (with its command-line `options`), healthy; DLAAS_* settings in
    `extra`."""
    port = port or free_port()
    env = clean_env(home, **extra)
    proc = subprocess.Popen(
        [DLAAS, "up", "--port", str(port), *options],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    up = Up(f"http://127.0.0.1:{port}", home, env, proc)

    def read() -> None:
        assert proc.stdout is not None
        for line in proc.stdout:
            up.lines.append(line)

    threading.Thread(target=read, daemon=True).start()
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            pytest.fail(f"dlaas up exited with {proc.returncode}:\n{up.output}")
        if "DLaaS is up" in up.output:
            try:
                if httpx.get(f"{up.url}/healthz").status_code == 200:
                    return up
            except httpx.TransportError:
                pass
        time.sleep(0.05)
    up.kill()
    pytest.fail(f"dlaas up did not become healthy:\n{up.output}")


@pytest.fixture
def dlaas_up(tmp_path: Path) -> Iterator[Up]:
    up = start_up(tmp_path / "home")
    try:
        yield up
    finally:
        up.kill()


def slow(seconds: float, name: str = "slow") -> dict[str, Any]:
    return {
        "name": name,
        "framework": {
            "name": "tensorflow",
            "version": "2.21",
            "command": f"python3 slow.py --seconds {seconds}",
        },
        "compute_configuration": {"name": "K80", "nodes": 1},
    }


def wait_status(client: Client, training_id: str, status: str, timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while (now := client.trainings.get(training_id)).status != status:
        assert not now.terminal and time.monotonic() < deadline, now
        time.sleep(0.1)


def alive(pid: int) -> bool:
    """Whether the process runs (a zombie nobody reaped yet does not)."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return False
    return state not in ("Z", "X")


def worker_pids(pid: int) -> list[int]:
    """The children of `dlaas up` (its Celery worker)."""
    children: list[int] = []
    for task in Path(f"/proc/{pid}/task").iterdir():
        text = (task / "children").read_text().split()
        children.extend(int(c) for c in text)
    return children


def test_dlaas_up_serves_the_api_on_embedded_defaults(dlaas_up: Up) -> None:
    url, home, proc = dlaas_up.url, dlaas_up.home, dlaas_up.proc
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

    # First start: a `local` tenant, and a client config (0600) that the client falls back to.
    config_file = home / "client.json"
    assert stat.S_IMODE(config_file.stat().st_mode) == 0o600
    config = json.loads(config_file.read_text())
    assert config["url"] == url and config["tenant"] == "local"
    code = "from dlaas import Client; c = Client(); print(c.url, len(c.trainings.list()))"
    out = subprocess.run(
        [sys.executable, "-c", code], env=dlaas_up.env, capture_output=True, text=True, check=True
    )
    assert out.stdout.split() == [url, "0"]  # the local tenant's trainings: none yet
    plans = {t.name: t.plan for t in Client(url, admin["Authorization"][7:]).tenants.list()}
    assert plans == {"local": "standard", "me": "standard"}

    # A second `dlaas up` on the same home is refused while this one runs.
    second = subprocess.run(
        [DLAAS, "up", "--port", str(free_port())],
        env=dlaas_up.env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert second.returncode == 1
    assert "another `dlaas up`" in second.stderr and "Traceback" not in second.stderr

    assert dlaas_up.stop(signal.SIGINT, timeout=30) == 0, dlaas_up.output
    assert proc.returncode == 0
    output = dlaas_up.output
    assert url in output and str(key_file) in output and str(config_file) in output
    # The migrations say one line, not Alembic's steps.
    assert [line for line in output.splitlines() if "database schema" in line] == [
        next(line for line in output.splitlines() if "database schema: created" in line)
    ], output
    assert "alembic" not in output and "Running upgrade" not in output, output
    # Runtimes install on their first use on the embedded platform, by default.
    assert "installed on their first use" in output


def test_install_runtimes_builds_every_runtime_in_the_background(tmp_path: Path) -> None:
    # A runtime with no pins builds in seconds: what matters is that `dlaas up` starts the
    # build of every defined runtime at start-up, says when it ends, and serves meanwhile.
    definitions = tmp_path / "definitions"
    definitions.mkdir()
    (definitions / "tiny.txt").write_text("# Runtime tiny: nothing pinned.\n")
    runtimes_dir = tmp_path / "runtimes"
    up = start_up(
        tmp_path / "home",
        options=("--install-runtimes",),
        DLAAS_RUNTIME_DEFINITIONS_DIR=str(definitions),
        DLAAS_RUNTIMES_DIR=str(runtimes_dir),
    )
    try:
        assert "building every runtime in the background" in up.output
        deadline = time.monotonic() + 180
        while "every runtime is installed" not in up.output:
            assert "a build failed" not in up.output, up.output
            assert time.monotonic() < deadline, up.output
            time.sleep(0.2)
        assert [p.parent.name[:5] for p in runtimes_dir.glob("*/runtime.json")] == ["tiny-"]
        assert "tiny: installed at" in (up.home / "runtimes-install.log").read_text()
        assert up.stop(signal.SIGINT, timeout=60) == 0, up.output
    finally:
        up.kill()


def test_a_busy_port_is_a_clear_error(tmp_path: Path) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        result = subprocess.run(
            [DLAAS, "up", "--port", str(port)],
            env=clean_env(tmp_path / "home"),
            capture_output=True,
            text=True,
            timeout=60,
        )
    assert result.returncode == 1
    assert f"cannot listen on 127.0.0.1:{port}" in result.stderr
    assert "Traceback" not in result.stderr


def test_ctrl_c_halts_running_trainings_and_the_next_up_resumes(tmp_path: Path) -> None:
    home = tmp_path / "home"
    up = start_up(home, DLAAS_LOCAL_SLOTS="1")  # one learner at a time: the second queues
    try:
        with up.client() as client:
            running = client.trainings.create(slow(60, "interrupted"), ENV_CODE)
            queued = client.trainings.create(slow(0.5, "waits"), ENV_CODE)
            wait_status(client, running.id, "RUNNING")
            assert client.trainings.get(queued.id).status == "QUEUED"
        assert training_processes(running.id)
        started = time.monotonic()
        assert up.stop(signal.SIGINT) == 0, up.output
        assert time.monotonic() - started < 30
        assert f"halted 1 running training(s): {running.id}" in up.output
        assert training_processes(running.id) == []
    finally:
        up.kill()

    config = json.loads((home / "client.json").read_text())
    up = start_up(home, DLAAS_LOCAL_SLOTS="1")
    try:
        # The tenant and its key are kept; the config follows the new port.
        again = json.loads((home / "client.json").read_text())
        assert again["api_key"] == config["api_key"] and again["url"] == up.url
        with up.client() as client:
            halted = client.trainings.get(running.id)
            assert halted.status == "HALTED"
            assert halted.status_message and "the platform was shut down" in (halted.status_message)
            assert [lr.status for lr in halted.learners] == ["HALTED"]
            assert any("tick=0" in line for line in client.trainings.logs(running.id))
            done = client.trainings.wait(queued.id, timeout=60, poll_interval=0.1)
            assert done.status == "COMPLETED", done
        assert up.stop() == 0
    finally:
        up.kill()


def test_ctrl_c_interrupts_a_retried_training_and_the_next_up_resumes_it(tmp_path: Path) -> None:
    """A training whose retry_policy covers lost learners is not halted by a shutdown: it
    resumes from its checkpoints as its next attempt when `dlaas up` starts again."""
    home = tmp_path / "home"
    code = tmp_path / "code"
    code.mkdir()
    (code / "train.py").write_text(TRAIN)
    doc = {
        "name": "resumed",
        "framework": {
            "name": "tensorflow",
            "version": "2.21",
            "command": "python3 train.py hang 8",
        },
        "compute_configuration": {"name": "K80", "nodes": 1},
        "retry_policy": {"max_retries": 1, "retry_on_lost": True},
    }
    up = start_up(home)
    try:
        with up.client() as client:
            training = client.trainings.create(doc, code)
            deadline = time.monotonic() + 60
            while not any(
                "step 5 checkpointed" in line for line in client.trainings.logs(training.id)
            ):
                assert time.monotonic() < deadline
                time.sleep(0.1)
        assert up.stop(signal.SIGINT) == 0, up.output
        assert "interrupted 1 training(s) that resume from their checkpoints" in up.output
        assert "running training(s)" not in up.output
        assert training_processes(training.id) == []
    finally:
        up.kill()

    up = start_up(home)
    try:
        with up.client() as client:
            waiting = client.trainings.get(training.id)
            assert waiting.attempt == 2
            assert waiting.status_message and "resumes as attempt 2" in waiting.status_message
            done = client.trainings.wait(training.id, timeout=90, poll_interval=0.2)
            assert done.status == "COMPLETED", done
            assert done.attempt == 2 and len(done.past_attempts) == 1
            log = "\n".join(client.trainings.logs(training.id))
            assert "resumed from checkpoint step 5" in log
            assert log.count("step 1 checkpointed") == 1
        assert up.stop() == 0
    finally:
        up.kill()


@pytest.fixture
def cluster_services(postgres_url: str) -> dict[str, str]:
    """DLAAS_* settings for PostgreSQL (this run's database, emptied) and Redis (this
    run's own, flushed: a broker no other run's worker reads)."""
    engine = make_engine(postgres_url)
    with engine.begin() as conn:
        tables = ", ".join(t.name for t in Base.metadata.sorted_tables)
        conn.execute(text(f"TRUNCATE {tables} CASCADE"))
    engine.dispose()
    url = run_redis.url(12)
    redis.Redis.from_url(url).flushdb()
    return {"DLAAS_DATABASE_URL": postgres_url, "DLAAS_BROKER_URL": url}


@pytest.mark.integration
def test_the_worker_is_restarted_and_dies_with_dlaas_up(
    tmp_path: Path, cluster_services: dict[str, str]
) -> None:
    # On the cluster's services: PostgreSQL, Redis as the broker and the live log.
    up = start_up(tmp_path / "home", **cluster_services)
    try:
        assert not (tmp_path / "home" / "dlaas.db").exists()
        [worker] = worker_pids(up.proc.pid)
        os.kill(worker, signal.SIGKILL)
        deadline = time.monotonic() + 20
        while worker_pids(up.proc.pid) in ([], [worker]):
            assert time.monotonic() < deadline, up.output
            time.sleep(0.1)
        [restarted] = worker_pids(up.proc.pid)
        assert "the worker exited" in up.output
        with up.client() as client:
            t = client.trainings.create(slow(0.5), ENV_CODE)
            assert client.trainings.wait(t.id, timeout=60, poll_interval=0.1).succeeded
        up.proc.kill()  # no chance to clean up: the kernel stops the worker
        up.proc.wait()
        deadline = time.monotonic() + 10
        while alive(restarted) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert not alive(restarted)
    finally:
        up.kill()
