"""Private PostgreSQL and Redis servers that a test owns: started on a free port under a
temporary directory, and stopped and started again at will (the shared servers on 5432
and 6379 are never touched)."""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from pathlib import Path

INITDB = shutil.which("initdb") or "/usr/local/bin/initdb"
PG_CTL = shutil.which("pg_ctl") or "/usr/local/bin/pg_ctl"
REDIS_SERVER = shutil.which("redis-server") or "/usr/bin/redis-server"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def wait_port(port: int, *, open_: bool, timeout: float = 30) -> None:
    deadline = time.monotonic() + timeout
    while True:
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=0.5):
                is_open = True
        except OSError:
            is_open = False
        if is_open == open_:
            return
        if time.monotonic() > deadline:
            raise TimeoutError(f"port {port} still {'closed' if open_ else 'open'}")
        time.sleep(0.05)


def _as_postgres() -> list[str]:
    """PostgreSQL refuses to run as root: as root, its tools run as the postgres user."""
    if os.geteuid() != 0:
        return []
    return ["runuser", "-u", "postgres", "--"]


class PrivatePostgres:
    """A PostgreSQL cluster of its own (initdb, trust authentication) on a free port."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.data = root / "data"
        self.port = free_port()
        self.url = f"postgresql+psycopg://postgres@127.0.0.1:{self.port}/postgres"

    def _run(self, *argv: str) -> None:
        subprocess.run(
            [*_as_postgres(), *argv],
            check=True,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            cwd=self.root,
        )

    def init(self) -> None:
        self._run(INITDB, "-D", str(self.data), "-A", "trust", "-U", "postgres", "--no-sync")

    def start(self) -> None:
        options = (
            f"-p {self.port} -k {self.root} -c listen_addresses=127.0.0.1 -c fsync=off "
            "-c max_connections=200"
        )
        log = str(self.root / "postgres.log")
        self._run(PG_CTL, "-D", str(self.data), "-o", options, "-l", log, "-w", "start")
        wait_port(self.port, open_=True)

    def stop(self, mode: str = "fast") -> None:
        self._run(PG_CTL, "-D", str(self.data), "-m", mode, "-w", "stop")
        wait_port(self.port, open_=False)


class PrivateRedis:
    """A redis-server of its own on a free port; it saves its data when stopped and loads
    it when started again, as a server with persistence does across a restart."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.port = free_port()
        self.url = f"redis://127.0.0.1:{self.port}/0"
        self.process: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        self.process = subprocess.Popen(
            [
                REDIS_SERVER,
                "--port",
                str(self.port),
                "--bind",
                "127.0.0.1",
                "--dir",
                str(self.root),
                "--save",
                "3600 1",
                "--appendonly",
                "no",
                "--daemonize",
                "no",
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        wait_port(self.port, open_=True)

    def stop(self) -> None:
        """SIGTERM: redis-server saves its data set and exits."""
        assert self.process is not None
        self.process.terminate()
        self.process.wait(timeout=30)
        self.process = None
        wait_port(self.port, open_=False)


@contextmanager
def private_dir() -> Iterator[Path]:
    """A directory the private servers may use (readable by the postgres user when the
    tests run as root); removed at the end."""
    root = Path(tempfile.mkdtemp(prefix="dlaas-faults-"))
    try:
        if os.geteuid() == 0:
            shutil.chown(root, "postgres", "postgres")
        yield root
    finally:
        shutil.rmtree(root, ignore_errors=True)


@contextmanager
def private_postgres() -> Iterator[PrivatePostgres]:
    with private_dir() as root:
        pg = PrivatePostgres(root)
        pg.init()
        pg.start()
        try:
            yield pg
        finally:
            with suppress(subprocess.CalledProcessError, TimeoutError):
                pg.stop("immediate")


@contextmanager
def private_redis() -> Iterator[PrivateRedis]:
    with private_dir() as root:
        server = PrivateRedis(root)
        server.start()
        try:
            yield server
        finally:
            if server.process is not None:
                server.process.kill()
                server.process.wait()
