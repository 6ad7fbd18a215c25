"""The monitor: one reconcile loop that turns backend observations into training states.

Each pass (every DLAAS_MONITOR_INTERVAL seconds, and at once when the backend says a
learner's status changed or, in `dlaas up`, when the API wrote an intent) it
1. observes the active trainings and applies service.domain.lifecycle's decision
   (progress, gang failure, completion, timeout, stop requests), recording each transition
   and each learner's state, then dispatches the actions (stop, finalize) to the worker;
2. admits queued trainings (worker.admitting, service.domain.admission: plan concurrency
   and learner slots, backend slots, gang start), moving them to PENDING and dispatching
   their launch;
3. deletes terminal trainings whose deletion was requested while they ran: those it
   ended in this pass at once, and those that ended elsewhere (a launch the worker
   failed) by a sweep of the database on the first pass, every
   DLAAS_MONITOR_FULL_PASS_SECONDS and after a deletion failed.

A pass with nothing to do asks the database only what it must: the active trainings with
their learners, and whether any tenant has a training queued.

Which trainings a pass observes: every active one where the backend cannot say which
changed (the local backend). Where it can (Kubernetes: its pod watch), a full pass every
DLAAS_MONITOR_FULL_PASS_SECONDS observes every one, and the passes between only those the
backend saw change, those written since the last pass and those whose reconciliation is
failing, so a pass costs what changed, not what runs.

It keeps no state that matters: killed and restarted at any time, it picks up from the
database and the backend. Only one monitor acts at a time (worker.leadership).

Run it alone with `python -m worker.monitor`.
"""

from __future__ import annotations

import logging
import signal
import threading
import time
from datetime import UTC, datetime, timedelta

from sqlalchemy.orm import Session

from service.db import repository
from service.db.models import Training, utcnow
from service.dispatch import FINALIZE, LAUNCH, STOP
from service.domain.gang_release import gang_release, releases, retries_after_releases
from service.domain.lifecycle import Action, decide, passed_through
from service.domain.reports import Malformed, clean_text
from service.domain.retries import Retries
from service.domain.states import TrainingState
from service.platform import Platform
from service.settings import Settings
from service.trainings import (
    attempt_started_at,
    delete_training,
    record_learner_states,
    record_restart,
    record_transition,
)
from worker.admitting import admit_queued, release_gang
from worker.backends import make_backend
from worker.backends.base import Backend, Observation, check_observation
from worker.leadership import leadership
from worker.porting_notes import with_porting_note

log = logging.getLogger("dlaas.monitor")

# A launch not visible in the backend after this long is sent again (a lost message).
LAUNCH_RETRY = timedelta(seconds=15)
# The same for the launch of a new attempt while the last attempt's learners are still
# there: longer, as that launch first stops them (a grace period) and saves checkpoints.
RESTART_RETRY = timedelta(seconds=60)
# Stop requests are re-sent this often until the learners are gone.
STOP_RETRY = 10.0
# A FINALIZE for a training the backend still holds is sent at most this often (it
# stops learners with a grace period and stores logs: it takes seconds).
FINALIZE_RETRY = 30.0
# A training whose reconciliation raised in this many passes in a row, over at least this
# long, is failed: an error that repeats is the training's, not a passing hiccup.
FAILING_PASSES = 3
FAILING_GRACE = timedelta(seconds=30)
# Learners' clocks may differ this much from the monitor's: a phase time further outside
# the training's lifetime makes a malformed report.
CLOCK_SKEW = timedelta(hours=1)
# A pass between two full ones reads the trainings written since the last pass began, less
# this much: what another process wrote (its clock may differ a little, its commit come a
# little later) is not missed. A full pass catches whatever still is.
TOUCHED_MARGIN = timedelta(seconds=5)


# How often a monitor waiting for its next pass looks whether it was asked to stop.
STOP_CHECK = 0.5
# The least time between the starts of two passes when a wakeup starts the second
# (`wait_for_next_pass`).
WAKE_SPACING = 0.05
# The same between two passes that only submissions woke: a burst of them is admitted by
# a pass at most every ADMISSION_SPACING (each pass reads the active trainings, the
# queue's head and the load; one per 50 ms took a fifth of the API's CPU at 80
# submissions a second), while a submission after a quiet spell of submissions is
# admitted at once, however busy the learners keep the monitor.
ADMISSION_SPACING = 0.2


def wait_for_next_pass(
    started: float,
    interval: float,
    wakeup: threading.Event,
    stop: threading.Event,
    spacing: float = WAKE_SPACING,
    urgent: threading.Event | None = None,
    admitted: float = float("-inf"),
    admission_spacing: float = ADMISSION_SPACING,
) -> bool:
    """Until the next pass is due: `interval` after this one `started` (time.monotonic),
    or sooner when woken, but not sooner than `spacing` after it started. A burst of
    wakeups (a submission each, a learner's status change each) is one pass, not one
    each. Where `urgent` is given, a wakeup without it (only submissions) also waits until
    `admission_spacing` after `admitted` (when the last pass that only submissions woke
    began), or until urgent news comes. A wakeup after a quiet spell starts a pass at
    once. Returns at once on `stop`; the wakeups stay set for the pass to clear.

    Returns whether only submissions woke it (the pass that follows is such a pass)."""
    next_pass = started + interval
    # In slices, so that a stop is seen soon whatever the interval.
    while not stop.is_set() and (left := next_pass - time.monotonic()) > 0:
        if wakeup.wait(min(left, STOP_CHECK)):
            only_submissions = False
            if urgent is not None and not urgent.is_set():
                rest = min(admitted + admission_spacing, next_pass) - time.monotonic()
                only_submissions = rest <= 0 or not urgent.wait(min(rest, STOP_CHECK))
            if (rest := started + spacing - time.monotonic()) > 0:
                stop.wait(rest)
            return only_submissions
    return False


class Monitor:
    def __init__(self, platform: Platform, backend: Backend) -> None:
        self.platform = platform
        self.backend = backend
        self._sent: dict[tuple[str, str], float] = {}
        # Trainings whose reconciliation failed: since when, and for how many passes.
        self._failing: dict[str, tuple[datetime, int]] = {}
        # On a backend that says which trainings changed: when the last full pass was, and
        # when the last pass began (what the next reads the trainings written since).
        self._full_every = timedelta(seconds=platform.settings.monitor_full_pass_seconds)
        self._last_full: datetime | None = None
        self._since = utcnow()
        # When the database was last swept for trainings left to delete (None: due now).
        self._last_sweep: datetime | None = None

    # -- one pass ------------------------------------------------------------------------

    def tick(self, now: datetime | None = None) -> None:
        now = now or utcnow()
        # Drained before anything is read: a change that comes during the pass is in the next.
        changed = self.backend.changed()
        full = changed is None or self._full_pass_due(now)
        outbox: list[tuple[str, str]] = []
        ended: list[Training] = []  # those this pass ended, their deletion requested
        try:
            with self.platform.sessions() as session:
                if full or changed is None:
                    trainings = repository.active_trainings(session)
                else:
                    # Those the backend saw change, those written since the last pass (a stop
                    # request, a launch), and those whose reconciliation is failing.
                    trainings = repository.active_trainings_among(
                        session, changed | set(self._failing), self._since - TOUCHED_MARGIN
                    )
                ids = [t.id for t in trainings]
                for training_id, training in zip(ids, trainings, strict=True):
                    if self._reconcile_isolated(session, training_id, training, now, outbox):
                        ended.append(training)
                if full:
                    for training_id in set(self._failing) - set(ids):
                        del self._failing[training_id]  # ended, or deleted: no longer watched
                admit_queued(
                    session,
                    self.platform.catalog.plans,
                    self.backend,
                    outbox,
                    self.platform.catalog.compute_configurations,
                )
                session.commit()
                if full:
                    self._release_ended(session, set(ids), outbox)
                self._delete_requested(session, ended, now)
            if full:
                self._last_full = now
            self._since = now
        finally:
            # What was decided is committed: send it even if a later step of the pass failed.
            for task, training_id in outbox:
                self._send(task, training_id)

    def _full_pass_due(self, now: datetime) -> bool:
        """Whether this pass reconciles every active training: the first, one every
        DLAAS_MONITOR_FULL_PASS_SECONDS (what only time changes: deadlines, launches sent
        again, pods missing for too long), and one after the clock went back."""
        return self._due(self._last_full, now)

    def _due(self, last: datetime | None, now: datetime) -> bool:
        """Whether DLAAS_MONITOR_FULL_PASS_SECONDS passed since `last` (or it never was,
        or the clock went back since)."""
        return last is None or not timedelta(0) <= now - last < self._full_every

    def _reconcile_isolated(
        self,
        session: Session,
        training_id: str,
        training: Training,
        now: datetime,
        outbox: list[tuple[str, str]],
    ) -> bool:
        """Reconcile one training, committed on its own: whatever its learners reported and
        whatever went wrong with it, the other trainings' reconciliation goes on. Returns
        whether it ended, its deletion requested: it is deleted in this pass.

        A malformed report fails the training at once. Any other error is logged and the
        training's changes rolled back (a fresh transaction, so PostgreSQL's aborted state
        does not carry over); the next pass tries again, and a training that has failed
        for FAILING_PASSES passes and FAILING_GRACE is failed, not watched forever."""
        sends: list[tuple[str, str]] = []
        try:
            malformed = self._reconcile(session, training, now, sends)
            if malformed is not None:
                log.warning("training %s: %s", training_id, malformed.message)
                self._fail(training, malformed.message, now)
                sends = [(FINALIZE, training_id)]
            session.commit()
        except Exception as e:
            session.rollback()
            first, passes = self._failing.get(training_id, (now, 0))
            passes += 1
            self._failing[training_id] = (first, passes)
            # The whole story the first time; after that, one line a pass.
            log.warning(
                "training %s: reconciling failed (%d pass(es) in a row): %s",
                training_id,
                passes,
                type(e).__name__,
                exc_info=passes == 1,
            )
            if passes >= FAILING_PASSES and now - first >= FAILING_GRACE:
                self._give_up(session, training_id, training, now, outbox)
            return False
        self._failing.pop(training_id, None)
        outbox.extend(sends)
        return training.delete_requested_at is not None and TrainingState(training.status).terminal

    def _give_up(
        self,
        session: Session,
        training_id: str,
        training: Training,
        now: datetime,
        outbox: list[tuple[str, str]],
    ) -> None:
        """Fail a training whose reconciliation keeps failing (its learners stopped and
        cleaned up by FINALIZE); if even that fails, the next pass tries again."""
        passes = self._failing[training_id][1]
        message = (
            f"the monitor could not observe or record this training for {passes} passes in a "
            "row; it was failed rather than left running unwatched"
        )
        try:
            self._fail(training, message, now)
            session.commit()
        except Exception:
            session.rollback()
            log.exception("training %s: could not be failed either", training_id)
            return
        log.error("training %s: failed after %d failed passes", training_id, passes)
        del self._failing[training_id]
        outbox.append((FINALIZE, training_id))

    @staticmethod
    def _fail(training: Training, message: str, now: datetime) -> None:
        if not TrainingState(training.status).terminal:
            record_transition(training, TrainingState.FAILED, message, at=now)

    def _reconcile(
        self, session: Session, training: Training, now: datetime, outbox: list[tuple[str, str]]
    ) -> Malformed | None:
        """Apply what the backend observed of the training; a malformed report is returned
        (nothing of it recorded)."""
        observation = self.backend.observe(training.id)
        state = TrainingState(training.status)
        if observation is None:
            if training.stop_requested_at is not None:
                record_transition(training, TrainingState.HALTED, "stopped by the user")
                outbox.append((FINALIZE, training.id))
            elif state == TrainingState.PENDING and now - training.updated_at > LAUNCH_RETRY:
                outbox.append((LAUNCH, training.id))  # the launch was lost: send it again
            return None
        if not isinstance(observation, Observation):
            return Malformed(f"the backend returned {type(observation).__name__}")
        if observation.attempt != training.attempt:
            # The learners of an attempt before this one: the LAUNCH of the new attempt
            # stops them and saves their checkpoints first; sent again if it was lost.
            if training.stop_requested_at is not None:
                record_transition(training, TrainingState.HALTED, "stopped by the user")
                outbox.append((FINALIZE, training.id))
            elif now - training.updated_at > RESTART_RETRY:
                outbox.append((LAUNCH, training.id))
            return None
        report = check_observation(
            observation,
            [lr.learner_id for lr in training.learners],
            window=(
                (training.created_at - CLOCK_SKEW).timestamp(),
                (now + CLOCK_SKEW).timestamp(),
            ),
        )
        if isinstance(report, Malformed):
            return report
        record_learner_states(training, report.learners)
        # What the backend could not enforce as asked here is said once, on the training
        # (its limits_note), never as the message of each transition.
        note = clean_text("; ".join(report.notes)) if report.notes else None
        if note is not None and note != training.limits_note:
            training.limits_note = note
        # A release queues the training again as its next attempt: a first attempt had
        # none, and its history is not read for them on every pass.
        released = (
            releases((e.status, e.message) for e in training.events) if training.attempt > 1 else 0
        )
        release = gang_release(
            report.learners,
            observation.unschedulable,
            now=now.timestamp(),
            limit_seconds=self.platform.settings.k8s_unschedulable_seconds,
            released_before=released,
        )
        if release is not None and training.stop_requested_at is None:
            log.info("training %s: %s", training.id, release.message)
            release_gang(training, release, now, outbox)
            return None
        manifest_runtime = training.manifest.get("max_runtime")
        decision = decide(
            state,
            report.learners,
            report.primaries,
            stop_requested=training.stop_requested_at is not None,
            started_at=attempt_started_at(training),
            max_runtime=int(manifest_runtime) if manifest_runtime else None,
            now=now,
            attempt=training.attempt,
            retries=retries_after_releases(
                Retries.of(training.manifest.get("retry_policy")), released
            ),
        )
        if Action.RETRY in decision.actions:
            retrying = decision.message or "retrying"
            attempt = record_restart(training, retrying, at=now)
            log.info("training %s: attempt %d: %s", training.id, attempt, retrying)
            outbox.append((LAUNCH, training.id))
            return None
        if decision.state is not None:
            message = decision.message
            if decision.state == TrainingState.FAILED and message is not None:
                message = with_porting_note(self.platform.logs, training, message)
            for skipped, at in passed_through(state, decision.state, report.learners):
                record_transition(training, skipped, None, at=datetime.fromtimestamp(at, UTC))
            record_transition(training, decision.state, message, at=now)
            log.info("training %s: %s -> %s %s", training.id, state, decision.state, message or "")
        elif state == TrainingState.DOWNLOADING:
            # The training data's download progress, shown while it runs (no transition).
            progress = next(
                (o.message for o in report.learners if o.phase == "DOWNLOADING" and o.message),
                None,
            )
            if progress is not None and progress != training.status_message:
                training.status_message = progress
        for action in decision.actions:
            outbox.append((FINALIZE if action == Action.FINALIZE else STOP, training.id))
        return None

    def _release_ended(
        self, session: Session, active: set[str], outbox: list[tuple[str, str]]
    ) -> None:
        """FINALIZE again the trainings that ended (or are gone) while the backend still
        holds something of theirs: the FINALIZE sent when they ended was lost (a worker
        killed while it ran it). Not more often than FINALIZE_RETRY a training."""
        held = [tid for tid in self.backend.held() if tid not in active]
        if not held:
            return
        status = repository.training_statuses(session, held)
        for training_id in held:
            state = status.get(training_id)
            if state is not None and not TrainingState(state).terminal:
                continue  # QUEUED (a launch on its way) or just admitted: not ended
            outbox.append((FINALIZE, training_id))

    def _delete_requested(self, session: Session, ended: list[Training], now: datetime) -> None:
        """Delete the trainings whose deletion was asked for while they ran, each committed
        on its own: those this pass `ended`, or, when a sweep is due (the first pass, one
        every DLAAS_MONITOR_FULL_PASS_SECONDS, the pass after a deletion failed), every
        one the database holds: those that ended elsewhere (a launch the worker failed, a
        monitor stopped between its two steps). One that cannot be deleted now (its store
        is down) is tried again next pass, and does not hold back the others."""
        if self._due(self._last_sweep, now):
            ended = list(repository.trainings_to_delete(session))
            self._last_sweep = now
        for training in ended:
            training_id = training.id
            try:
                delete_training(session, self.platform.store, self.platform.logs, training)
                session.commit()
            except Exception:
                session.rollback()
                self._last_sweep = None
                log.exception(
                    "training %s: could not be deleted; trying again next pass", training_id
                )

    def _send(self, task: str, training_id: str) -> None:
        key = (task, training_id)
        now = time.monotonic()
        if task == STOP and now - self._sent.get(key, -STOP_RETRY) < STOP_RETRY:
            return
        if task == FINALIZE and now - self._sent.get(key, -FINALIZE_RETRY) < FINALIZE_RETRY:
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
        wakeup, urgent = self.platform.monitor_wakeup, self.platform.monitor_urgent
        # Woken by the API in this process (embedded) and at once by learners' status
        # changes (the backend's notifications); polling catches everything else.
        with (
            leadership(self.platform, stop) as leader,
            self.backend.changes(self.platform.wake_monitor),
        ):
            log.info("monitor running (every %.2f s)", interval)
            admitted = float("-inf")  # when the last pass only submissions woke began
            while not stop.is_set():
                started = time.monotonic()
                urgent.clear()
                wakeup.clear()
                if not leader.held():
                    # The database restarted (or dropped the lock's connection): another
                    # monitor may lead now. Act again only once this one leads again.
                    log.warning("the monitor lock was lost; waiting to take it again")
                    leader.take()
                    continue
                try:
                    self.tick()
                except Exception:
                    log.exception("monitor pass failed; retrying")
                if wait_for_next_pass(
                    started, interval, wakeup, stop, urgent=urgent, admitted=admitted
                ):
                    admitted = time.monotonic()


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
