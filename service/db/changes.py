"""Which trainings changed, as PostgreSQL tells the processes that listen.

Every change to a training, its learners or its status history notifies
`TRAINING_CHANNEL` with the training's id, from triggers in the writing transaction
(migration 0006): every writer, whatever process or statement made the change, and only
once it commits. `TrainingChanges` listens on its own connection, in its own thread, and
tells its owner which trainings changed and how far its knowledge reaches: every change
committed before the time it reports with `caught_up` has been handed to `changed`.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable

import psycopg
from sqlalchemy.engine import URL

from service.db.session import CONNECT_TIMEOUT

log = logging.getLogger("dlaas.db.changes")

TRAINING_CHANNEL = "dlaas_training_changed"  # the migration's CHANNEL
# The triggers that notify it (migration 0006): without them nothing is heard.
_TRIGGERS = ["dlaas_notify_trainings", "dlaas_notify_learners", "dlaas_notify_status_events"]
# How often a database without them is looked at again (it may be migrated meanwhile).
NO_TRIGGERS_RETRY_SECONDS = 30.0
# The listening connection's name in pg_stat_activity.
APPLICATION_NAME = "dlaas-training-changes"
# The longest the listener waits for notifications before it looks whether it is closing:
# `close` returns within it, however long `every` is (DLAAS_MONITOR_INTERVAL, 60 s for some).
CLOSE_CHECK_SECONDS = 0.25


class TrainingChanges:
    """Listen until `close`. `changed(training_id)` for each change; `caught_up(t)` (t:
    `time.monotonic()`) about every `every` / 2 seconds while the connection works: every
    change committed before t was handed to `changed`; `lost()` when the connection
    fails (what was heard may be incomplete), after which it connects again, or when the
    database has no triggers to notify (not migrated to 0006: nothing is ever caught up).

    How the bound holds: each round trip (`SELECT 1`) ends after the server has sent
    every notification committed before it started (PostgreSQL delivers them when the
    listening session's transaction ends, ahead of its answer), and psycopg keeps those
    received during a query for the next `notifies()`. A thread of its own, not a task
    on the API's event loop: a loop busy with requests would delay the round trips, and
    the bound with them, just when the kept bodies matter most."""

    def __init__(
        self,
        url: URL,
        *,
        changed: Callable[[str], None],
        caught_up: Callable[[float], None],
        lost: Callable[[], None],
        every: float,
        retry_after: float = 1.0,
    ) -> None:
        self._conninfo = url.set(drivername="postgresql").render_as_string(hide_password=False)
        self._changed, self._caught_up, self._lost = changed, caught_up, lost
        self._every, self._retry_after = every, retry_after
        self._closing = threading.Event()
        self._thread = threading.Thread(target=self._run, name="training changes", daemon=True)
        self._thread.start()

    def close(self) -> None:
        """Stop listening (within CLOSE_CHECK_SECONDS, or a round trip or connect under way)."""
        self._closing.set()
        self._thread.join(timeout=self._every + CONNECT_TIMEOUT)

    def _run(self) -> None:
        warned = False
        while not self._closing.is_set():
            wait = self._retry_after
            try:
                if not self._listen():
                    if not warned:
                        log.warning(
                            "the database has no training change triggers (migration "
                            "0006): every read of a training goes to it"
                        )
                        warned = True
                    wait = NO_TRIGGERS_RETRY_SECONDS
            except psycopg.Error as e:
                log.warning("training change notifications interrupted: %s", e)
            self._lost()
            self._closing.wait(wait)

    def _listen(self) -> bool:
        """Listen until closing (True), or False at once if nothing would notify."""
        with psycopg.connect(
            self._conninfo,
            autocommit=True,
            connect_timeout=CONNECT_TIMEOUT,
            application_name=APPLICATION_NAME,
        ) as conn:
            conn.execute(f"LISTEN {TRAINING_CHANNEL}")
            found = conn.execute(
                "SELECT count(*) FROM pg_trigger WHERE tgname = ANY(%s)", [_TRIGGERS]
            ).fetchone()
            if found is None or found[0] != len(_TRIGGERS):
                return False
            while not self._closing.is_set():
                started = time.monotonic()
                conn.execute("SELECT 1")
                # What arrived up to the answer first, then the bound moves.
                for notify in conn.notifies(timeout=0):
                    self._changed(notify.payload)
                self._caught_up(started)
                until = started + self._every / 2
                while not self._closing.is_set() and (left := until - time.monotonic()) > 0:
                    for notify in conn.notifies(timeout=min(left, CLOSE_CHECK_SECONDS)):
                        self._changed(notify.payload)
            return True
