"""`dlaas up`: the whole platform from one command.

What runs where:
- this process: the API (uvicorn, in a thread), the monitor (a thread), and in the main
  thread a supervisor that handles signals and owns the worker;
- one Celery worker, `python -m worker`, as a child process. Celery wants a process of its
  own (its main thread, its signal handlers, its pool), so `dlaas up` supervises it instead:
  started with the platform, restarted (with a back-off) if it dies, stopped on Ctrl-C, and
  killed by the kernel if `dlaas up` itself is killed (PR_SET_PDEATHSIG). Its output goes to
  `$DLAAS_HOME/worker.log`.
All of them read the same DLAAS_* settings, so the embedded platform takes the code paths of a
cluster: SQLite, the broker directory and the object-store directory under DLAAS_HOME by
default, or whatever DLAAS_DATABASE_URL, DLAAS_BROKER_URL and DLAAS_S3_* name.

On first start it creates a tenant named `local` (standard plan) and writes the client
configuration (`$DLAAS_HOME/client.json`, or `$DLAAS_CONFIG`; mode 0600) with the API's URL
and that tenant's key, so `dlaas train ...` and `dlaas.Client()` need no flags. Later starts
keep the key and update the URL.

Ctrl-C (SIGINT) or SIGTERM shut it down cleanly, in this order: the API stops taking
requests; the monitor stops; the worker stops (finishing a task it is running) while the
learners of every training that has some are stopped, and those trainings are recorded
HALTED with a message saying the platform was shut down (their logs are archived as for any
ended training). Nothing else is touched: the database, the object store, tenants, results,
deployments and the client configuration are kept.

What the next `dlaas up` resumes: QUEUED trainings start as capacity allows; a training
that was PENDING with no learner started yet is launched (the monitor re-sends launches it
does not see in the backend); trainings whose learners outlived an unclean end of `dlaas up`
(SIGKILL, a crash) are observed where they are and finish normally, or fail as lost if their
learners are gone too. A training halted by the shutdown is not re-run (states never go
back): submit it again.
"""

from __future__ import annotations

import contextlib
import fcntl
import logging
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import IO

from dlaas.config import ClientConfig, config_path, load_config, write_config
from service.platform import Platform
from service.settings import Settings

log = logging.getLogger("dlaas.up")

LOCAL_TENANT = "local"
LOCAL_PLAN = "standard"
SHUTDOWN_MESSAGE = (
    "interrupted: the platform was shut down (dlaas up stopped) while the training was "
    "{state}; its learners were stopped. Submit it again to re-run it"
)
# Python run as the worker's first program: ask the kernel to SIGTERM it when `dlaas up`
# dies, then become `python -m worker` (the request survives exec).
_WORKER_BOOT = """
import ctypes, os, signal, sys
try:
    ctypes.CDLL(None, use_errno=True).prctl(1, int(signal.SIGTERM))  # PR_SET_PDEATHSIG
except (OSError, AttributeError):
    pass
if os.getppid() != int(sys.argv[1]):
    sys.exit(0)
os.execv(sys.executable, [sys.executable, "-m", "worker"])
"""


class EmbeddedError(RuntimeError):
    """`dlaas up` could not start; the message says why."""


def client_url(host: str, port: int) -> str:
    """The URL a client on this machine uses for an API listening on host:port."""
    if host in ("0.0.0.0", ""):  # noqa: S104 - the address a user passes, not one we bind
        host = "127.0.0.1"
    elif host == "::":
        host = "::1"
    if ":" in host:
        host = f"[{host}]"
    return f"http://{host}:{port}"


def ensure_local_tenant(platform: Platform, url: str) -> tuple[Path, str]:
    """The `local` tenant and the client configuration that holds its key.

    Creates the tenant on first start; writes a fresh key only when the configuration has
    none that this platform accepts (keys are stored hashed and cannot be read back).
    Returns the configuration's path and the tenant's name.
    """
    from service.auth import hash_api_key, new_api_key, new_id
    from service.db import repository
    from service.db.models import ApiKey, Tenant

    path = config_path(platform.settings.home_dir)
    existing = load_config(path)
    with platform.sessions() as session:
        if existing is not None and existing.api_key:
            tenant = repository.tenant_for_key_hash(session, hash_api_key(existing.api_key))
            if tenant is not None:
                if existing.url != url or existing.tenant != tenant.name:
                    write_config(ClientConfig(url, existing.api_key, tenant.name), path)
                return path, tenant.name
        tenant = repository.tenant_by_name(session, LOCAL_TENANT)
        if tenant is None:
            plans = platform.catalog.plans
            plan = LOCAL_PLAN if LOCAL_PLAN in plans else next(iter(plans))
            tenant = Tenant(id=new_id(), name=LOCAL_TENANT, plan=plan)
            session.add(tenant)
            session.flush()
        key = new_api_key()
        session.add(
            ApiKey(id=new_id(), tenant_id=tenant.id, key_hash=hash_api_key(key), prefix=key[:12])
        )
        session.commit()
        name = tenant.name
    write_config(ClientConfig(url, key, name), path)
    return path, name


class WorkerSupervisor:
    """The embedded Celery worker: one child process, restarted if it dies.

    All its methods run in the main thread (the kernel ties PR_SET_PDEATHSIG to the thread
    that started the child).
    """

    MIN_BACKOFF = 1.0
    MAX_BACKOFF = 30.0
    HEALTHY_AFTER = 60.0

    def __init__(self, log_path: Path, echo: Callable[[str], None]) -> None:
        self.log_path = log_path
        self.echo = echo
        self.proc: subprocess.Popen[bytes] | None = None
        self.restarts = 0
        self._started_at = 0.0
        self._backoff = self.MIN_BACKOFF
        self._restart_at: float | None = None
        self._log: IO[bytes] | None = None

    def start(self) -> None:
        if self._log is None:
            self._log = open(self.log_path, "ab")  # noqa: SIM115 - kept for the child's life
        self.proc = subprocess.Popen(
            [sys.executable, "-c", _WORKER_BOOT, str(os.getpid())],
            stdin=subprocess.DEVNULL,
            stdout=self._log,
            stderr=self._log,
            start_new_session=True,  # Ctrl-C in the terminal reaches `dlaas up` only
        )
        self._started_at = time.monotonic()
        self._restart_at = None

    def check(self) -> None:
        """Restart the worker if it has exited (after a back-off that grows while it keeps
        dying young)."""
        if self.proc is None:
            return
        code = self.proc.poll()
        if code is None:
            return
        now = time.monotonic()
        if self._restart_at is None:
            if now - self._started_at > self.HEALTHY_AFTER:
                self._backoff = self.MIN_BACKOFF
            self._restart_at = now + self._backoff
            self.echo(
                f"the worker exited with code {code}; restarting it in {self._backoff:.0f} s "
                f"(see {self.log_path})"
            )
            self._backoff = min(self._backoff * 2, self.MAX_BACKOFF)
        if now >= self._restart_at:
            self.restarts += 1
            self.start()

    def terminate(self) -> None:
        """Ask the worker to stop (SIGTERM: Celery finishes the task it runs, then exits)."""
        proc = self.proc
        if proc is not None and proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGTERM)

    def stop(self, timeout: float = 30.0) -> None:
        """Stop the worker and wait for it: SIGTERM, SIGKILL after `timeout` seconds."""
        self.terminate()
        proc = self.proc
        if proc is not None and proc.poll() is None:
            try:
                proc.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
        if self._log is not None:
            self._log.close()
            self._log = None


def interrupt_active_trainings(platform: Platform) -> list[str]:
    """Stop the learners of every training that has some and record it HALTED (see the
    module's docstring); returns the ids of the trainings interrupted. Call it only when no
    monitor and no worker run."""
    from sqlalchemy import select

    from service.db.models import Training
    from service.domain.states import TrainingState
    from service.trainings import record_transition
    from worker import execution
    from worker.backends import make_backend
    from worker.monitor import ACTIVE

    backend = make_backend(platform.settings)
    with platform.sessions() as session:
        active = session.scalars(select(Training.id).where(Training.status.in_(ACTIVE))).all()
    started = [tid for tid in active if backend.observe(tid) is not None]
    if not started:
        return []
    with ThreadPoolExecutor(max_workers=min(8, len(started))) as pool:
        list(pool.map(backend.stop, started))
    for training_id in started:
        observation = backend.observe(training_id)
        with platform.sessions() as session:
            training = session.get(Training, training_id)
            if training is None or TrainingState(training.status).terminal:
                continue
            if observation is not None:
                rows = {lr.learner_id: lr for lr in training.learners}
                for obs in observation.learners:
                    if (row := rows.get(obs.learner_id)) is not None:
                        row.status, row.exit_code, row.status_message = (
                            obs.phase,
                            obs.exit_code,
                            obs.message,
                        )
            message = (
                "stopped by the user"
                if training.stop_requested_at is not None
                else SHUTDOWN_MESSAGE.format(state=training.status)
            )
            record_transition(training, TrainingState.HALTED, message)
            session.commit()
        try:
            execution.finalize(platform, backend, training_id)
        except Exception:
            log.exception("archiving the logs of %s failed", training_id)
    return started


def _listen(host: str, port: int) -> socket.socket:
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    # Accepted connections inherit it: without, small responses wait ~40 ms for Nagle.
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    try:
        sock.bind((host, port))
    except OSError as e:
        sock.close()
        raise EmbeddedError(f"cannot listen on {host}:{port}: {e.strerror or e}") from e
    sock.listen(2048)
    sock.set_inheritable(False)
    return sock


def _lock_home(home: Path) -> IO[str]:
    """Hold $DLAAS_HOME/up.lock for this process's life: one `dlaas up` per home."""
    home.mkdir(parents=True, exist_ok=True)
    lock = open(home / "up.lock", "a+")  # noqa: SIM115 - held until the process ends
    try:
        fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        lock.seek(0)
        holder = lock.read().strip() or "another process"
        lock.close()
        raise EmbeddedError(
            f"another `dlaas up` ({holder}) is running on {home}; stop it first or set "
            "DLAAS_HOME to another directory"
        ) from None
    lock.seek(0)
    lock.truncate()
    lock.write(f"pid {os.getpid()}\n")
    lock.flush()
    return lock


def serve(host: str, port: int, *, echo: Callable[[str], None] = print) -> None:
    """Run the platform until SIGINT or SIGTERM, then shut it down (see the module's
    docstring). Must run in the main thread. Raises EmbeddedError if it cannot start."""
    import uvicorn

    from service.api.app import create_app
    from worker.backends import make_backend
    from worker.monitor import Monitor

    if threading.current_thread() is not threading.main_thread():
        raise EmbeddedError("dlaas up must run in the main thread (it handles the signals)")
    if not logging.getLogger().handlers:
        logging.basicConfig(
            level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s"
        )

    settings = Settings()
    home_lock = _lock_home(settings.home_dir)
    sock = _listen(host, port)
    url = client_url(host, sock.getsockname()[1])
    platform = Platform.from_settings(settings)
    try:
        platform.migrate()
        config_file, tenant = ensure_local_tenant(platform, url)
    except BaseException:
        sock.close()
        platform.close()
        raise

    stopping = threading.Event()

    def on_signal(signum: int, _frame: object) -> None:
        if stopping.is_set():
            echo("already shutting down: stopping the learners, then exiting")
        stopping.set()

    previous = {s: signal.signal(s, on_signal) for s in (signal.SIGINT, signal.SIGTERM)}
    worker = WorkerSupervisor(settings.home_dir / "worker.log", echo)
    monitor_stop = threading.Event()
    monitor = threading.Thread(
        target=Monitor(platform, make_backend(settings)).run,
        args=(monitor_stop,),
        name="dlaas-monitor",
        daemon=True,
    )
    server = uvicorn.Server(
        uvicorn.Config(
            create_app(platform=platform),
            log_level="info",
            access_log=False,
            timeout_graceful_shutdown=3,
        )
    )
    # server.run: on uvicorn's own event loop (uvloop where installed), as `uvicorn` serves.
    api = threading.Thread(
        target=server.run, kwargs={"sockets": [sock]}, name="dlaas-api", daemon=True
    )
    failure: str | None = None
    try:
        worker.start()
        monitor.start()
        api.start()
        deadline = time.monotonic() + 60
        while not server.started and api.is_alive() and not stopping.is_set():
            if time.monotonic() > deadline:
                break
            time.sleep(0.02)
        if not server.started and not stopping.is_set():
            failure = "the API did not start (see the messages above)"
        else:
            admin = (
                "DLAAS_ADMIN_API_KEY" if settings.admin_api_key else str(settings.admin_key_file)
            )
            echo(f"DLaaS is up on {url}  (API docs: {url}/docs)")
            echo(f"  home:          {settings.home_dir}")
            echo(f"  admin API key: {admin}")
            echo(f"  client config: {config_file}  (tenant '{tenant}'; used by dlaas and Client())")
            echo(f"  worker log:    {worker.log_path}")
            echo("Press Ctrl-C to stop: running trainings are halted, everything else is kept.")
        while failure is None and not stopping.wait(0.5):
            worker.check()
            if not api.is_alive():
                failure = "the API stopped unexpectedly (see the messages above)"
    finally:
        echo("shutting down: API, monitor, worker, learners")
        worker.terminate()  # it takes a few seconds: let it go while the rest stops
        server.should_exit = True
        api.join(timeout=15)
        monitor_stop.set()
        platform.monitor_wakeup.set()
        monitor.join(timeout=15)
        try:
            # Stop the learners while the worker winds down (it takes seconds), then look
            # once more for learners a launch it was finishing may have started.
            with ThreadPoolExecutor(max_workers=1) as pool:
                first = pool.submit(interrupt_active_trainings, platform)
                worker.stop()
                halted = first.result()
            halted += interrupt_active_trainings(platform)
            if halted:
                echo(f"halted {len(halted)} running training(s): {', '.join(halted)}")
        finally:
            platform.close()
            sock.close()
            for sig, handler in previous.items():
                signal.signal(sig, handler)
            home_lock.close()
        echo("stopped; state kept in " + str(settings.home_dir))
    if failure is not None:
        raise EmbeddedError(failure)
