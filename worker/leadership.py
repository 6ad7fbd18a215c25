"""Which monitor acts: only one at a time on a platform. On PostgreSQL a session-level
advisory lock on a connection of its own (a database restart drops it, and the monitor
waits to take it again); on SQLite an exclusive lock on a file beside the database (one
machine)."""

from __future__ import annotations

import contextlib
import fcntl
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Protocol

from sqlalchemy import Connection, Engine

from service.db import repository
from service.db.session import DATABASE_UNAVAILABLE
from service.platform import Platform

# The advisory lock's key: "DLAB".
LOCK_ID = 0x444C4142


class Leadership(Protocol):
    def take(self) -> None:
        """Block until this monitor leads (or it is asked to stop)."""
        ...

    def held(self) -> bool:
        """Whether it still leads (a lock on a database connection goes with it)."""
        ...

    def release(self) -> None: ...


class AdvisoryLock:
    """PostgreSQL's session-level advisory lock, held on one connection of its own: a
    database restart drops it (and the lock) and `held` says so."""

    def __init__(self, engine: Engine, stop: threading.Event) -> None:
        self.engine = engine
        self.stop = stop
        self.conn: Connection | None = None

    def take(self) -> None:
        while not self.stop.is_set():
            try:
                if self.conn is None:
                    self.conn = self.engine.connect()
                if repository.try_advisory_lock(self.conn, LOCK_ID):
                    return
            except DATABASE_UNAVAILABLE:  # down or restarting: try again in a moment
                self.release()
            self.stop.wait(1.0)

    def held(self) -> bool:
        if self.conn is None:
            return False
        try:
            repository.ping(self.conn)
            self.conn.rollback()  # not left idle in a transaction; the lock is the session's
        except DATABASE_UNAVAILABLE:
            self.release()
            return False
        return True

    def release(self) -> None:
        if self.conn is not None:
            with contextlib.suppress(Exception):
                self.conn.close()
            self.conn = None


class FileLock:
    """An exclusive lock on a file beside the SQLite database (one machine)."""

    def __init__(self, path: Path, stop: threading.Event) -> None:
        self.file = open(path, "w")  # noqa: SIM115 - held for the monitor's lifetime
        self.stop = stop
        self.locked = False

    def take(self) -> None:
        while not self.stop.is_set():
            try:
                fcntl.flock(self.file, fcntl.LOCK_EX | fcntl.LOCK_NB)
                self.locked = True
                return
            except BlockingIOError:
                self.stop.wait(1.0)

    def held(self) -> bool:
        return self.locked

    def release(self) -> None:
        self.file.close()


@contextlib.contextmanager
def leadership(platform: Platform, stop: threading.Event) -> Iterator[Leadership]:
    """Wait until this is the only monitor acting on the platform."""
    engine = platform.engine
    if engine.dialect.name == "postgresql":
        leader: Leadership = AdvisoryLock(engine, stop)
    else:
        leader = FileLock(platform.settings.home_dir / "monitor.lock", stop)
    try:
        leader.take()
        yield leader
    finally:
        leader.release()
