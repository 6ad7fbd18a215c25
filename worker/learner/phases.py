"""The learner's phase machine: fetch (DOWNLOADING), meet the peers, run (RUNNING),
store (STORING), and the outcome (COMPLETED, FAILED or HALTED).

Fetch and store hold credentials and run here, in the trusted wrapper; the user's
command runs through the backend's prefix (its sandbox) with only the learner's
environment. Every phase goes to the backend's `StatusReporter`.

Exit codes: 0 the command succeeded; 1 it failed; 2 a platform error (message in the
status); 143 stopped by SIGTERM/SIGINT.
"""

from __future__ import annotations

import os
import signal
import subprocess
import time
from collections.abc import Callable
from pathlib import Path
from types import FrameType

from service.domain.states import TrainingState
from service.logs.base import LogStore
from service.sandbox import limits
from service.sandbox.limits import Enforcement
from service.storage import keys
from service.storage.base import ObjectStore
from worker.learner.host import Rendezvous
from worker.learner.logdir import LogDirSync
from worker.learner.logmetrics import LogMetrics
from worker.learner.logtee import LogTee
from worker.learner.spec import LearnerSpec
from worker.learner.status import Status, StatusReporter
from worker.learner.supervision import Supervisor, describe_exit
from worker.learner.transfers import PlatformError, Transfers, open_log_sink, open_store

EXIT_OK = 0
EXIT_COMMAND_FAILED = 1
EXIT_PLATFORM_ERROR = 2
EXIT_HALTED = 143

_TEE_DRAIN_SECONDS = 5.0  # how long to wait for the output pipe to close after the command


class _Stopped(BaseException):
    """Raised by the signal handler to abandon the preparation phases."""


class Learner:
    def __init__(
        self,
        spec: LearnerSpec,
        *,
        reporter: StatusReporter,
        rendezvous: Rendezvous,
        private_dir: Path,
        run_prefix: list[str] | None = None,
        enforcement: Enforcement | None = None,
    ) -> None:
        self.spec = spec
        self.reporter = reporter
        self.rendezvous = rendezvous
        self.private_dir = private_dir
        self.run_prefix = list(run_prefix or [])
        self.enforcement = enforcement or Enforcement()
        self.log_path = private_dir / keys.LEARNER_LOG_NAME
        self.transfers = Transfers(spec, private_dir, self.log_path)
        self.supervisor = Supervisor(spec.stop_grace_seconds)
        self.phase: TrainingState | None = None
        self.interruptible = False  # whether a stop abandons the current phase at once
        self.phase_times: dict[str, float] = {}

    def status(
        self,
        phase: TrainingState,
        *,
        exit_code: int | None = None,
        message: str | None = None,
        child_pid: int | None = None,
    ) -> None:
        self.phase_times.setdefault(phase.value, time.time())
        self.reporter.report(Status(phase, exit_code, message, child_pid, dict(self.phase_times)))
        self.phase = phase

    def on_signal(self, signum: int, frame: FrameType | None) -> None:
        self.supervisor.stop_requested = True
        if self.interruptible:
            self.interruptible = False
            raise _Stopped
        self.supervisor.forward_term()

    def run(self) -> int:
        previous = {
            sig: signal.signal(sig, self.on_signal) for sig in (signal.SIGTERM, signal.SIGINT)
        }
        learner = self.spec.learner_id
        stopped = f"learner {learner} was stopped before its command started"
        try:
            try:
                self.status(TrainingState.DOWNLOADING)
                return self.run_phases()
            except _Stopped:
                self.interruptible = False
                self.status(TrainingState.HALTED, message=stopped)
                return EXIT_HALTED
            except PlatformError as e:
                self.interruptible = False
                self.status(TrainingState.FAILED, message=str(e))
                return EXIT_PLATFORM_ERROR
            except Exception as e:
                self.interruptible = False
                message = f"learner {learner}: the learner wrapper failed: {type(e).__name__}: {e}"
                self.status(TrainingState.FAILED, message=message)
                return EXIT_PLATFORM_ERROR
        except _Stopped:  # the handler raises once; this one hit while a failure was handled
            self.interruptible = False
            if self.phase is None or not self.phase.terminal:
                self.status(TrainingState.HALTED, message=stopped)
            return EXIT_HALTED
        finally:
            self.interruptible = False
            if self.phase is None or not self.phase.terminal:
                message = f"learner {learner}: the learner wrapper ended unexpectedly"
                self.status(TrainingState.FAILED, message=message)
            for sig, handler in previous.items():
                signal.signal(sig, handler)

    def run_phases(self) -> int:
        spec = self.spec
        self.interruptible = True
        if self.supervisor.stop_requested:
            raise _Stopped
        store = open_store(spec.store)
        log_store = open_log_sink(spec.log_sink)
        # fetch
        self.transfers.fetch_code(store)
        self.transfers.make_directories()
        self.transfers.check_results_target()
        self.transfers.fetch_data(self.downloading)
        try:
            self.rendezvous.ready()
        except OSError as e:
            raise PlatformError(f"the learner's directories could not be created: {e}") from e
        if spec.waits_for_peers and (missing := self.rendezvous.wait()):
            raise PlatformError(
                f"learner {spec.learner_id}: the other learners were not ready within "
                f"{self.rendezvous.timeout:g} s; still missing: {', '.join(missing)}"
            )
        self.interruptible = False
        if self.supervisor.stop_requested:
            raise _Stopped
        # run, then store
        return self.run_command(store, log_store)

    def downloading(self, message: str) -> None:
        self.status(TrainingState.DOWNLOADING, message=message)

    def _before_exec(self) -> Callable[[], None] | None:
        enforcement = self.enforcement
        if enforcement == Enforcement():
            return None
        return lambda: limits.apply(enforcement)

    def run_command(self, store: ObjectStore, log_store: LogStore) -> int:
        spec = self.spec
        self.private_dir.mkdir(parents=True, exist_ok=True)
        metrics = LogMetrics(spec.learner_id, spec.log_metrics) if spec.log_metrics else None
        tee = LogTee(
            spec.learner_id,
            spec.training_id,
            log_store,
            self.log_path,
            max_bytes=spec.max_log_bytes,
            metrics=metrics,
        )
        try:
            limits.prepare(self.enforcement)
            proc = self.supervisor.start(
                list(spec.argv),
                prefix=self.run_prefix,
                cwd=spec.model_dir,
                env=spec.env,
                before_exec=self._before_exec(),
            )
        except (OSError, ValueError, subprocess.SubprocessError) as e:
            tee.close(0)
            raise PlatformError(
                f"learner {spec.learner_id} could not start its command: {e}"
            ) from e
        assert proc.stdout is not None
        sync = LogDirSync(spec, self.transfers, store, metrics)
        halted = True  # until supervision says otherwise
        try:
            self.status(TrainingState.RUNNING, child_pid=proc.pid)
            tee.start(os.dup(proc.stdout.fileno()))
            proc.stdout.close()
            sync.start()
            code, halted = self.supervisor.supervise()
        finally:
            if self.supervisor.child is not None:  # supervision failed: leave nothing running
                self.supervisor.kill(proc)
            tee.close(_TEE_DRAIN_SECONDS)
            sync.stop(last_pass=not halted)
            limits.release(self.enforcement)
        if halted:
            # The log is small and matters most now; results of an interrupted run do not.
            # Tried once: the platform waits only its stop grace for a stopped learner.
            self.transfers.store(store, self.transfers.log_only(), patient=False)
            message = f"learner {spec.learner_id} was stopped"
            if self.supervisor.kill_sent:
                grace = f"{spec.stop_grace_seconds:g} s"
                message += f"; its command did not stop within {grace} of SIGTERM and was killed"
            self.status(TrainingState.HALTED, exit_code=code, message=message)
            return EXIT_HALTED
        self.status(TrainingState.STORING)
        errors = self.transfers.store(store, list(self.transfers.files_to_upload()))
        if code != 0:
            message = describe_exit(spec.learner_id, code)
            if errors:
                message += f"; storing its files also failed: {errors[0]}"
            self.status(TrainingState.FAILED, exit_code=code, message=message)
            return EXIT_COMMAND_FAILED
        if errors:
            message = f"learner {spec.learner_id} could not store its files: {errors[0]}"
            self.status(TrainingState.FAILED, exit_code=code, message=message)
            return EXIT_PLATFORM_ERROR
        self.status(TrainingState.COMPLETED, exit_code=code)
        return EXIT_OK
