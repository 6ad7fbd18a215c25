"""One monitor acts at a time, also across a database restart: a monitor whose lock's
connection is dropped (what a PostgreSQL restart does) stops acting until it holds the
lock again, while another monitor that took it meanwhile leads alone."""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Callable, Iterator
from datetime import datetime
from pathlib import Path

import pytest
from sqlalchemy import text

from service.db import repository
from service.platform import Platform
from service.settings import Settings
from tests.fakes import Learners
from worker.leadership import LOCK_ID
from worker.monitor import Monitor

pytestmark = pytest.mark.integration


class Counted(Monitor):
    def __init__(self, platform: Platform) -> None:
        super().__init__(platform, Learners())  # observes nothing; passes are only counted
        self.passes = 0

    def tick(self, now: datetime | None = None) -> None:
        self.passes += 1


@contextlib.contextmanager
def running(monitor: Monitor) -> Iterator[threading.Event]:
    stop = threading.Event()
    thread = threading.Thread(target=monitor.run, args=(stop,), daemon=True)
    thread.start()
    try:
        yield stop
    finally:
        stop.set()
        thread.join(timeout=10)


def lock_holder(platform: Platform) -> int | None:
    with platform.engine.connect() as conn:
        return conn.execute(
            text(
                "SELECT pid FROM pg_locks WHERE locktype = 'advisory' AND granted "
                "AND objid = :id AND database = (SELECT oid FROM pg_database "
                "WHERE datname = current_database())"
            ),
            {"id": LOCK_ID},
        ).scalar()


def wait_until(check: Callable[[], bool], timeout: float = 15) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        assert time.monotonic() < deadline
        time.sleep(0.05)


def test_a_monitor_whose_lock_is_dropped_stops_acting(tmp_path: Path, postgres_url: str) -> None:
    """PostgreSQL's advisory lock (SQLite's is a file lock on one machine)."""
    settings = Settings(home=tmp_path / "home", database_url=postgres_url, monitor_interval=0.05)
    platform = Platform.from_settings(settings)
    platform.migrate()
    monitor = Counted(platform)
    try:
        with running(monitor):
            wait_until(lambda: monitor.passes > 0)
            holder = lock_holder(platform)
            assert holder is not None
            with platform.engine.connect() as other:
                # The lock's connection goes, as in a database restart, and another
                # monitor (this connection) takes the lock before this one is back.
                other.execute(text("SELECT pg_terminate_backend(:pid)"), {"pid": holder})
                other.commit()
                deadline = time.monotonic() + 10
                while not repository.try_advisory_lock(other, LOCK_ID):
                    assert time.monotonic() < deadline
                time.sleep(0.3)  # the monitor notices within a pass
                acted = monitor.passes
                time.sleep(1.0)
                assert monitor.passes == acted  # no pass while another monitor leads
                other.invalidate()  # the other monitor gone: its session (and lock) with it
            # This one leads again.
            wait_until(lambda: monitor.passes > acted)
            assert lock_holder(platform) not in (None, holder)
    finally:
        platform.close()
