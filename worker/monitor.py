"""The monitor: one reconcile loop that turns backend observations into training states.

Each pass (every DLAAS_MONITOR_INTERVAL seconds, and at once when the backend says a
learner's status changed or, in `dlaas up`, when the API wrote an intent) it
1. observes every active training and applies service.domain.lifecycle's decision
   (progress, gang failure, completion, timeout, stop requests), recording each transition
   and each learner's state, then dispatches the actions (stop, finalize) to the worker;
2. admits queued trainings (service.domain.admission: plan concurrency, backend slots,
   gang start), moving them to PENDING and dispatching their launch;
3. deletes terminal trainings whose deletion was requested while they ran.

It keeps no state that matters: killed and restarted at any time, it picks up from the
database and the backend. Only one monitor acts at a time (a lock: PostgreSQL advisory
lock, or a file lock beside the SQLite database).

Run it alone with `python -m worker.monitor`.
"""

from __future__ import annotations

import contextlib
import fcntl
import logging
import signal
import threading
import time
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta

from sqlalchemy.orm import Session

from service.db import repository
from service.db.models import Training, utcnow
from service.dispatch import FINALIZE, LAUNCH, STOP
from service.domain.admission import Candidate, admit
from service.domain.lifecycle import Action, decide, passed_through
from service.domain.states import TrainingState
from service.platform import Platform
from service.settings import Settings
from service.trainings import delete_training, record_learner_states, record_transition
from worker.backends import make_backend
from worker.backends.base import Backend

log = logging.getLogger("dlaas.monitor")

# A launch not visible in the backend after this long is sent again (a lost message).
LAUNCH_RETRY = timedelta(seconds=15)
# Stop requests are re-sent this often until the learners are gone.
STOP_RETRY = 10.0
_LOCK_ID = 0x444C4142


# How often a monitor waiting for its next pass looks whether it was asked to stop.
STOP_CHECK = 0.5


class Monitor:
    def __init__(self, platform: Platform, backend: Backend) -> None:
        self.platform = platform
        self.backend = backend
        self._sent: dict[tuple[str, str], float] = {}

    # -- one pass ------------------------------------------------------------------------

    def tick(self, now: datetime | None = None) -> None:
        now = now or utcnow()
        outbox: list[tuple[str, str]] = []
        with self.platform.sessions() as session:
            for training in repository.active_trainings(session):
                self._reconcile(session, training, now, outbox)
            session.commit()
            self._admit(session, outbox)
            session.commit()
            self._delete_requested(session)
            session.commit()
        for task, training_id in outbox:
            self._send(task, training_id)

    def _reconcile(
        self, session: Session, training: Training, now: datetime, outbox: list[tuple[str, str]]
    ) -> None:
        observation = self.backend.observe(training.id)
        state = TrainingState(training.status)
        if observation is None:
            if training.stop_requested_at is not None:
                record_transition(training, TrainingState.HALTED, "stopped by the user")
                outbox.append((FINALIZE, training.id))
            elif state == TrainingState.PENDING and now - training.updated_at > LAUNCH_RETRY:
                outbox.append((LAUNCH, training.id))  # the launch was lost: send it again
            return
        record_learner_states(training, observation.learners)
        manifest_runtime = training.manifest.get("max_runtime")
        decision = decide(
            state,
            observation.learners,
            observation.primaries,
            stop_requested=training.stop_requested_at is not None,
            started_at=training.started_at,
            max_runtime=int(manifest_runtime) if manifest_runtime else None,
            now=now,
        )
        if decision.state is not None:
            message = decision.message
            if message is None and observation.notes:
                message = "; ".join(observation.notes)
            for skipped, at in passed_through(state, decision.state, observation.learners):
                record_transition(training, skipped, None, at=datetime.fromtimestamp(at, UTC))
            record_transition(training, decision.state, message, at=now)
            log.info("training %s: %s -> %s %s", training.id, state, decision.state, message or "")
        elif state == TrainingState.DOWNLOADING:
            # The training data's download progress, shown while it runs (no transition).
            progress = next(
                (o.message for o in observation.learners if o.phase == "DOWNLOADING" and o.message),
                None,
            )
            if progress is not None and progress != training.status_message:
                training.status_message = progress
        for action in decision.actions:
            outbox.append((FINALIZE if action == Action.FINALIZE else STOP, training.id))

    def _admit(self, session: Session, outbox: list[tuple[str, str]]) -> None:
        queued = repository.queued_trainings(session)
        if not queued:
            return
        active = repository.active_trainings(session)
        per_tenant: dict[str, int] = {}
        for t in active:
            per_tenant[t.tenant_id] = per_tenant.get(t.tenant_id, 0) + 1
        plans = repository.plans_of_tenants(session, {t.tenant_id for t in queued})
        catalog = self.platform.catalog.plans
        concurrency = {
            tid: catalog[plan].max_concurrent_trainings if plan in catalog else 0
            for tid, plan in plans.items()
        }
        free = self.backend.slots() - sum(t.nodes for t in active)
        admitted = set(
            admit(
                [Candidate(t.id, t.tenant_id, t.nodes) for t in queued],
                active_per_tenant=per_tenant,
                concurrency_per_tenant=concurrency,
                free_slots=free,
            )
        )
        for training in queued:
            if training.id in admitted:
                record_transition(
                    training, TrainingState.PENDING, f"starting {training.nodes} learner(s)"
                )
                outbox.append((LAUNCH, training.id))
            elif training.nodes > self.backend.slots():
                record_transition(
                    training,
                    TrainingState.FAILED,
                    f"capacity: {training.nodes} learners can never fit this platform's "
                    f"{self.backend.slots()} learner slots",
                )

    def _delete_requested(self, session: Session) -> None:
        for training in repository.trainings_to_delete(session):
            delete_training(session, self.platform.store, self.platform.logs, training)

    def _send(self, task: str, training_id: str) -> None:
        key = (task, training_id)
        now = time.monotonic()
        if task == STOP and now - self._sent.get(key, -STOP_RETRY) < STOP_RETRY:
            return
        self._sent[key] = now
        try:
            self.platform.dispatcher.send(task, training_id)
        except Exception:  # the broker is down: the next pass decides again
            log.exception("could not send %s for %s", task, training_id)
            self._sent.pop(key, None)

    # -- the loop ------------------------------------------------------------------------

    def run(self, stop: threading.Event) -> None:
        interval = self.platform.settings.monitor_interval
        wakeup = self.platform.monitor_wakeup
        # Woken at once by the API in this process (embedded) and by learners' status
        # changes (the backend's notifications); polling catches everything else.
        with self._leadership(stop), self.backend.changes(wakeup.set):
            log.info("monitor running (every %.2f s)", interval)
            while not stop.is_set():
                started = time.monotonic()
                wakeup.clear()
                try:
                    self.tick()
                except Exception:
                    log.exception("monitor pass failed; retrying")
                next_pass = started + interval
                # In slices, so that a stop is seen soon whatever the interval.
                while not stop.is_set() and (left := next_pass - time.monotonic()) > 0:
                    if wakeup.wait(min(left, STOP_CHECK)):
                        break

    @contextlib.contextmanager
    def _leadership(self, stop: threading.Event) -> Iterator[None]:
        """Wait until this is the only monitor acting on the platform."""
        engine = self.platform.engine
        if engine.dialect.name == "postgresql":
            with engine.connect() as conn:
                while not stop.is_set() and not repository.try_advisory_lock(conn, _LOCK_ID):
                    stop.wait(1.0)
                yield
            return
        path = self.platform.settings.home_dir / "monitor.lock"
        with open(path, "w") as f:
            while not stop.is_set():
                try:
                    fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
                    break
                except BlockingIOError:
                    stop.wait(1.0)
            yield


def main() -> None:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    settings = Settings()
    platform = Platform.from_settings(settings)
    monitor = Monitor(platform, make_backend(settings))
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    signal.signal(signal.SIGINT, lambda *_: stop.set())
    monitor.run(stop)


if __name__ == "__main__":
    main()
