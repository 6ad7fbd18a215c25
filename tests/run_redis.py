"""This test run's own Redis server, for the tests that flush a database, use Redis as a
Celery broker, or name keys and ACL users that are the same in every run: on a Redis
shared by two test runs at once (two clones on one machine), one run's flush or queue
would be the other's.

Started on first use (a redis-server on a free port, no persistence, in the session's
temporary directory), stopped at the end of the session (tests/conftest.py). Tests whose
keys are unique per run (random training ids) use the machine's Redis as before.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from pathlib import Path

_server: subprocess.Popen[bytes] | None = None
_port = 0
_directory: tempfile.TemporaryDirectory[str] | None = None


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def url(db: int = 0) -> str:
    """`redis://127.0.0.1:<port>/<db>` of this run's server, started if it is not yet."""
    global _server, _port, _directory
    if _server is None or _server.poll() is not None:
        executable = shutil.which("redis-server") or "/usr/bin/redis-server"
        _directory = tempfile.TemporaryDirectory(prefix="dlaas-test-redis-")
        _port = _free_port()
        argv = [executable, "--port", str(_port), "--bind", "127.0.0.1", "--save", ""]
        argv += ["--appendonly", "no", "--dir", _directory.name]
        with open(Path(_directory.name) / "redis.log", "ab") as log:
            _server = subprocess.Popen(argv, stdout=log, stderr=log, start_new_session=True)
        deadline = time.monotonic() + 20
        while True:
            try:
                with socket.create_connection(("127.0.0.1", _port), timeout=1):
                    break
            except OSError:
                if time.monotonic() > deadline or _server.poll() is not None:
                    raise RuntimeError("this test run's redis-server did not start") from None
                time.sleep(0.05)
    return f"redis://127.0.0.1:{_port}/{db}"


def stop() -> None:
    """Stop the server, if one was started."""
    global _server, _directory
    if _server is not None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(_server.pid, signal.SIGKILL)
        _server.wait()
        _server = None
    if _directory is not None:
        _directory.cleanup()
        _directory = None
