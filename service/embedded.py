"""`dlaas up`: the whole platform from one command.

The API serves in this process, the monitor runs in a thread beside it, and one Celery
worker runs as a child process (Celery wants its own main thread); all of them use the
same settings, so the embedded platform takes the same code paths as a cluster.
"""

from __future__ import annotations

import subprocess
import sys
import threading
from collections.abc import Callable

from service.platform import Platform
from service.settings import Settings


def serve(host: str, port: int, *, echo: Callable[[str], None] = print) -> None:
    import uvicorn

    from service.api.app import create_app
    from worker.backends import make_backend
    from worker.monitor import Monitor

    settings = Settings()
    platform = Platform.from_settings(settings)
    platform.migrate()
    where = "DLAAS_ADMIN_API_KEY" if settings.admin_api_key else str(settings.admin_key_file)
    echo(f"DLaaS API on http://{host}:{port}  (docs: http://{host}:{port}/docs)")
    echo(f"home: {settings.home_dir}   admin API key: {where}")

    worker = subprocess.Popen([sys.executable, "-m", "worker"])
    stop = threading.Event()
    monitor = threading.Thread(
        target=Monitor(platform, make_backend(settings)).run, args=(stop,), daemon=True
    )
    monitor.start()
    try:
        uvicorn.run(create_app(platform=platform), host=host, port=port, log_level="info")
    finally:
        stop.set()
        monitor.join(timeout=10)
        worker.terminate()
        try:
            worker.wait(timeout=30)
        except subprocess.TimeoutExpired:
            worker.kill()
        platform.close()
