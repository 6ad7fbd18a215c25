"""The rendered `GET /v1/trainings/{id}` of the trainings clients are polling, kept by an
API process on PostgreSQL and answered without a query while it is known to be current.

On PostgreSQL each read of a training costs the API process more than the rest of the
request (the async driver's waits and a greenlet switch per statement: see the README's
Performance section), and the clients following a training ask for it again and again
while it rarely changes. So the process keeps the body it rendered, and forgets it when
the training changes:

- **its own writes** (read-your-writes): a commit of any session of the platform's
  sessionmaker that wrote a training, its learners or its history forgets those trainings
  before the commit returns, so the request that wrote answers only after it (`watch`);
- **every other writer's** (another API process, the monitor, the worker): the database
  notifies each change at its commit (migration 0006) and the listener
  (`service.db.changes.TrainingChanges`) forgets it.

A kept body is answered only while the listener has caught up within `bound` seconds
(the monitor's interval): a change another process commits is seen by this one at most
`bound` later, and in practice within the notification's delivery (milliseconds). While
the listener is not connected, or lags, nothing is answered from here: reads go to the
database as before. A read that began before a change forgets nothing it should not: a
body read before a change is not kept if the training was forgotten since (`mark`).

Only the caller's own trainings are answered: a body is kept with its tenant, and another
tenant's request for it reads the database (which answers 404)."""

from __future__ import annotations

import math
import threading
import time
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from sqlalchemy import event
from sqlalchemy.engine import URL
from sqlalchemy.orm import Session, sessionmaker

from service.db.changes import TrainingChanges
from service.db.models import Learner, StatusEvent, Training


@dataclass(frozen=True, slots=True)
class _Kept:
    tenant_id: str
    body: bytes


@dataclass(frozen=True, slots=True)
class _Forgotten:
    at: int  # the change sequence when it was forgotten


class TrainingViews:
    """What this process knows of its trainings' current bodies (see the module's
    docstring). Thread-safe: the loop reads and fills it, sessions on worker threads
    and the listener forget."""

    def __init__(self, bound: float, size: int = 10_000) -> None:
        self.bound = bound
        self.size = size
        self._entries: dict[str, _Kept | _Forgotten] = {}
        self._lock = threading.Lock()
        self._sequence = 0  # one more at every forget
        self._cleared_at = 0  # the sequence at the last clear
        self._caught_up_at = -math.inf
        self._changes: TrainingChanges | None = None
        # Session.info key: the trainings a session's transaction wrote, as this one
        # collects them (another TrainingViews watching the same sessions has its own).
        self._changed_key = f"dlaas_trainings_changed_{id(self)}"

    def get(self, tenant_id: str, training_id: str) -> bytes | None:
        """The training's body if it is kept, the tenant's, and known to be current."""
        if time.monotonic() - self._caught_up_at >= self.bound:
            return None
        entry = self._entries.get(training_id)
        if isinstance(entry, _Kept) and entry.tenant_id == tenant_id:
            return entry.body
        return None

    def mark(self) -> int:
        """Read before reading a training from the database; hand it to `put`."""
        return self._sequence

    def put(self, tenant_id: str, training_id: str, body: bytes, mark: int) -> None:
        """Keep the body read after `mark`, unless the training (or everything) was
        forgotten since: the read may predate the change."""
        with self._lock:
            if mark < self._cleared_at:
                return
            entry = self._entries.get(training_id)
            if isinstance(entry, _Forgotten) and entry.at > mark:
                return
            if len(self._entries) >= self.size:
                self._clear()
            self._entries[training_id] = _Kept(tenant_id, body)

    def forget(self, training_ids: Iterable[str]) -> None:
        """These trainings changed: their bodies are read again."""
        with self._lock:
            for training_id in training_ids:
                self._sequence += 1
                self._entries[training_id] = _Forgotten(self._sequence)
            if len(self._entries) > self.size:
                self._clear()

    @property
    def caught_up_at(self) -> float:
        """Every change committed before this time.monotonic() has been forgotten."""
        return self._caught_up_at

    def caught_up(self, at: float) -> None:
        """Every change committed before `at` (time.monotonic()) has been forgotten."""
        self._caught_up_at = max(self._caught_up_at, at)

    def lost(self) -> None:
        """Changes may have been missed: answer nothing from here until caught up again."""
        with self._lock:
            self._caught_up_at = -math.inf
            self._clear()

    def _clear(self) -> None:
        self._sequence += 1
        self._cleared_at = self._sequence
        self._entries.clear()

    # -- the two sources of changes --------------------------------------------------

    def watch(self, sessions: sessionmaker[Session]) -> None:
        """Forget what the sessions of `sessions` write, as each commit returns."""
        event.listen(sessions, "after_flush", self._collect)
        event.listen(sessions, "after_commit", self._after_commit)

    def unwatch(self, sessions: sessionmaker[Session]) -> None:
        event.remove(sessions, "after_flush", self._collect)
        event.remove(sessions, "after_commit", self._after_commit)

    def _collect(self, session: Session, _flush_context: Any) -> None:
        """Remember which trainings this flush wrote (the lists still hold what it
        flushed)."""
        changed: set[str] = session.info.setdefault(self._changed_key, set())
        for obj in (*session.new, *session.dirty, *session.deleted):
            if isinstance(obj, Training):
                changed.add(obj.id)
            elif isinstance(obj, Learner | StatusEvent):
                changed.add(obj.training_id)

    def _after_commit(self, session: Session) -> None:
        # A rollback keeps what was collected: forgetting more than changed costs one
        # read, and a savepoint's rollback must not drop what its transaction wrote.
        changed = session.info.pop(self._changed_key, None)
        if changed:
            self.forget(changed)

    def listen(self, url: URL) -> None:
        """Start following the database's change notifications (a thread of its own)."""
        self._changes = TrainingChanges(
            url,
            changed=lambda training_id: self.forget((training_id,)),
            caught_up=self.caught_up,
            lost=self.lost,
            every=self.bound,
        )

    def close(self) -> None:
        if self._changes is not None:
            self._changes.close()
            self._changes = None
