"""Serving `dlaas up`: the API (uvicorn, in a thread), the monitor (a thread) and, in the
main thread, a supervisor that handles signals and owns the worker (see the package's
docstring for the whole story)."""

from __future__ import annotations

import fcntl
import logging
import os
import signal
import socket
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import IO

from composition.backend import close_backend, describe_backend, open_backend
from composition.bootstrap import client_url, ensure_local_tenant
from composition.errors import EmbeddedError
from composition.runtime_builds import RuntimeBuilds, embedded_defaults
from composition.shutdown import interrupt_active_trainings
from composition.supervisor import WorkerSupervisor
from service.platform import Platform
from service.private import FILE_MODE, private_home
from service.settings import Settings
from service.tenants import LOCAL_TENANT

log = logging.getLogger("dlaas.up")


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


def _owner_only(path: str, flags: int) -> int:
    return os.open(path, flags, FILE_MODE)


def _lock_home(home: Path) -> IO[str]:
    """Hold $DLAAS_HOME/up.lock for this process's life: one `dlaas up` per home."""
    private_home(home)
    # Held until the process ends.
    lock = open(home / "up.lock", "a+", opener=_owner_only)  # noqa: SIM115
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


def serve(
    host: str,
    port: int,
    *,
    echo: Callable[[str], None] = print,
    install_runtimes: bool = False,
) -> None:
    """Run the platform until SIGINT or SIGTERM, then shut it down (see the module's
    docstring). Must run in the main thread. Raises EmbeddedError if it cannot start.

    Runtimes install on their first use unless DLAAS_RUNTIME_AUTO_INSTALL says otherwise;
    with `install_runtimes` every runtime starts building at start-up, in the background
    (composition.runtime_builds)."""
    import uvicorn

    from service.api.app import create_app
    from service.http.server import server_config
    from worker.monitor import Monitor

    if threading.current_thread() is not threading.main_thread():
        raise EmbeddedError("dlaas up must run in the main thread (it handles the signals)")
    if not logging.getLogger().handlers:
        logging.basicConfig(
            level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s"
        )

    os.environ.update(embedded_defaults(os.environ))
    settings = Settings()
    home_lock = _lock_home(settings.home_dir)
    sock = _listen(host, port)
    url = client_url(host, sock.getsockname()[1])
    platform = Platform.from_settings(settings)
    try:
        platform.migrate()
        config_file, tenant = ensure_local_tenant(platform, url)
        backend = open_backend(settings)
    except BaseException:
        sock.close()
        platform.close()
        home_lock.close()
        raise

    stopping = threading.Event()

    def on_signal(signum: int, _frame: object) -> None:
        if stopping.is_set():
            echo("already shutting down: stopping the learners, then exiting")
        stopping.set()

    previous = {s: signal.signal(s, on_signal) for s in (signal.SIGINT, signal.SIGTERM)}
    worker = WorkerSupervisor(settings.home_dir / "worker.log", echo)
    builds = (
        RuntimeBuilds(settings.home_dir / "runtimes-install.log", echo)
        if install_runtimes and settings.backend == "local"
        else None
    )
    monitor_stop = threading.Event()
    monitor = threading.Thread(
        target=Monitor(platform, backend).run,
        args=(monitor_stop,),
        name="dlaas-monitor",
        daemon=True,
    )
    app = create_app(platform=platform)
    server = uvicorn.Server(server_config(app, log_level="info", timeout_graceful_shutdown=3))
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
            echo(f"  dashboard:     {url}/ui/")
            echo(f"  home:          {settings.home_dir}")
            echo(f"  learners:      {describe_backend(settings, backend)}")
            echo(f"  admin API key: {admin}")
            echo(f"  client config: {config_file}  (tenant '{tenant}'; used by dlaas and Client())")
            echo(f"  worker log:    {worker.log_path}")
            if settings.runtime_auto_install and settings.backend == "local":
                echo("  runtimes:      installed on their first use (DLAAS_RUNTIME_AUTO_INSTALL)")
            if builds is not None:
                builds.start()
            grpc_port = getattr(app.state, "grpc_port", None)  # DLAAS_SCORING_GRPC_PORT
            if grpc_port is not None:
                echo(
                    f"  scoring gRPC:  {settings.scoring_grpc_host}:{grpc_port}  "
                    "(TensorFlow Serving's PredictionService)"
                )
            if (why := backend.unsandboxed_reason()) is not None:
                who = (
                    "every tenant's (DLAAS_ALLOW_UNSANDBOXED=true)"
                    if settings.allow_unsandboxed
                    else f"the '{LOCAL_TENANT}' tenant's only; other tenants' are refused"
                )
                echo(f"  WARNING: learners run without a sandbox here ({why}): {who}")
            halted = "halted, their pods deleted" if settings.backend == "kubernetes" else "halted"
            echo(f"Press Ctrl-C to stop: running trainings are {halted}, everything else is kept.")
        while failure is None and not stopping.wait(0.5):
            worker.check()
            if builds is not None:
                builds.check()
            if not api.is_alive():
                failure = "the API stopped unexpectedly (see the messages above)"
    finally:
        echo("shutting down: API, monitor, worker, learners")
        if builds is not None:
            builds.stop()
        worker.terminate()  # it takes a few seconds: let it go while the rest stops
        server.should_exit = True
        api.join(timeout=15)
        monitor_stop.set()
        platform.wake_monitor()
        monitor.join(timeout=15)
        close_backend(backend)
        try:
            # Stop the learners while the worker winds down (it takes seconds), then look
            # once more for learners a launch it was finishing may have started.
            with ThreadPoolExecutor(max_workers=1) as pool:
                first = pool.submit(interrupt_active_trainings, platform)
                worker.stop()
                interrupted = first.result()
            interrupted += interrupt_active_trainings(platform)
            if interrupted.halted:
                ids = ", ".join(interrupted.halted)
                echo(f"halted {len(interrupted.halted)} running training(s): {ids}")
            if interrupted.resuming:
                ids = ", ".join(interrupted.resuming)
                echo(
                    f"interrupted {len(interrupted.resuming)} training(s) that resume from "
                    f"their checkpoints on the next start (their retry_policy): {ids}"
                )
        finally:
            platform.close()
            sock.close()
            for sig, handler in previous.items():
                signal.signal(sig, handler)
            home_lock.close()
        echo("stopped; state kept in " + str(settings.home_dir))
    if failure is not None:
        raise EmbeddedError(failure)
