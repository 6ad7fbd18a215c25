"""A learner pod's trusted steps, in the platform's image with the learner's spec (and so
the store's credentials): `fetch` (the init container) and `agent` (the native sidecar).
The user's command runs between them in the `learner` container (worker.learner.pod_run)
and never sees the spec.

Both reuse the local wrapper's parts: fetch is its DOWNLOADING phase
(worker.learner.transfers), the agent its log tee (worker.learner.logtee: the same
records, learner id and max_log_bytes cap), its LOG_DIR sync and TensorBoard metrics while
the command runs (worker.learner.logdir) and its STORING phase (the same keys). The
pod's CHECKPOINT_DIR is its own, which the platform cannot read: fetch restores the last
attempt's into it, the agent saves it (LearnerSpec.restore_checkpoints, checkpoints_prefix). The
agent reads the command's output from the `io` volume (worker.learner.pod_io) instead of
a pipe, stores once the exit file appears, answers with the `stored` file, and then waits
to be stopped: the kubelet stops a native sidecar after the learner container exits.
"""

from __future__ import annotations

import os
import signal
import sys
import tempfile
import time
from pathlib import Path
from types import FrameType
from typing import BinaryIO

from service.logs.base import LogStore
from service.storage import keys
from service.storage.base import ObjectStore
from service.tenantfs import TenantDir
from worker.learner import pod_io
from worker.learner.logdir import LogDirSync
from worker.learner.logmetrics import LogMetrics
from worker.learner.logtee import LogTee
from worker.learner.spec import LearnerSpec
from worker.learner.transfers import PlatformError, Transfers, open_log_sink, open_store

EXIT_OK = 0
EXIT_PLATFORM_ERROR = 2
EXIT_STOPPED = 143

_TEE_DRAIN_SECONDS = 5.0


def default_private_dir() -> Path:
    """The step's own files (the code archive while it unpacks, the learner's log): in the
    container's own /tmp, which the learner container does not mount."""
    return Path(tempfile.gettempdir()) / "dlaas-learner"


def _setup(spec_path: Path) -> tuple[LearnerSpec, ObjectStore, LogStore]:
    try:
        spec = LearnerSpec.read(spec_path)
    except (OSError, ValueError) as e:
        raise PlatformError(f"the learner spec {spec_path} cannot be read: {e}") from e
    return spec, open_store(spec.store), open_log_sink(spec.log_sink)


def _fail(termination_log: str, message: str) -> int:
    print(f"learner wrapper: {message}", file=sys.stderr, flush=True)
    pod_io.write_termination_message(termination_log, message)
    return EXIT_PLATFORM_ERROR


# -- fetch ------------------------------------------------------------------------------


def fetch(spec_path: Path, private_dir: Path, termination_log: str) -> int:
    """The code into MODEL_DIR, the training data into DATA_DIR, the other directories
    made; 0, or EXIT_PLATFORM_ERROR with the reason in the termination message."""
    try:
        spec, store, _ = _setup(spec_path)
        transfers = Transfers(spec, private_dir, private_dir / keys.LEARNER_LOG_NAME)
        transfers.fetch_code(store)
        transfers.make_directories(*([home] if (home := spec.env.get("HOME")) else []))
        transfers.check_results_target()
        transfers.fetch_data(lambda message: print(message, flush=True))
        if restored := transfers.restore_checkpoints(store):
            print(f"restored {restored} checkpoint files of the last attempt", flush=True)
    except PlatformError as e:
        return _fail(termination_log, str(e))
    except Exception as e:
        return _fail(termination_log, f"fetching failed: {type(e).__name__}: {e}")
    print(f"learner {spec.learner_id}: the code and data are in place", flush=True)
    return EXIT_OK


# -- agent ------------------------------------------------------------------------------


class AgentIo:
    """The agent's reader of the `io` volume, which the learner container (the tenant)
    writes: listed and opened from the directory's descriptor through service.tenantfs,
    so a link there to the spec (the store's credentials) or to /proc is never read."""

    def __init__(self, io_dir: Path) -> None:
        self.io_dir = io_dir
        self._dir: TenantDir | None = None

    def _directory(self) -> TenantDir:
        if self._dir is None:
            self._dir = TenantDir.open(self.io_dir)  # FileNotFoundError until it exists
        return self._dir

    def names(self) -> list[str]:
        try:
            return self._directory().names()
        except FileNotFoundError:
            return []

    def open(self, name: str) -> BinaryIO:
        directory = self._directory()
        opened = directory.open_file(name)
        if opened is None:
            if name not in directory.names():
                raise FileNotFoundError(name)
            raise ValueError(f"{self.io_dir / name} is not a regular file of its own")
        return opened.stream()

    def close(self) -> None:
        if self._dir is not None:
            self._dir.close()


class Agent:
    def __init__(self, spec: LearnerSpec, io_dir: Path, private_dir: Path) -> None:
        self.spec = spec
        self.io_dir = io_dir
        private_dir.mkdir(parents=True, exist_ok=True)
        self.log_path = private_dir / keys.LEARNER_LOG_NAME
        self.transfers = Transfers(spec, private_dir, self.log_path)
        self.io = AgentIo(io_dir)
        self.stopping = False
        self.ended: pod_io.Exit | None = None  # how the command ended, once it has

    def on_signal(self, signum: int, frame: FrameType | None) -> None:
        self.stopping = True

    def tee(self, log_store: LogStore, metrics: LogMetrics | None = None) -> None:
        """Send the command's output to the log store (and the learner's log file) until
        the command has ended, or the agent is stopped, and every line has been sent; with
        `metrics`, search it for the training's metric regexes as it goes."""
        spec = self.spec
        tee = LogTee(
            spec.learner_id,
            spec.training_id,
            log_store,
            self.log_path,
            max_bytes=spec.max_log_bytes,
            metrics=metrics,
        )
        read_end, write_end = os.pipe()
        tee.start(read_end)

        def into_tee(data: bytes) -> None:
            view = memoryview(data)
            while view:
                view = view[os.write(write_end, view) :]

        try:
            pod_io.follow(self.io_dir, into_tee, stop=lambda: self.stopping, reader=self.io)
        finally:
            os.close(write_end)
            tee.close(_TEE_DRAIN_SECONDS)

    def store(self, store: ObjectStore) -> pod_io.Stored:
        """Store as the local wrapper does: everything after a run, the log alone (tried
        once) after a stop; then CHECKPOINT_DIR (for the next attempt, if there is one),
        whichever way the command ended. A checkpoint that could not be saved is said on
        stderr; it does not fail the results, which are stored."""
        learner = self.spec.learner_id
        try:
            self.ended = ended = pod_io.Exit.read(self.io_dir, self.io)
        except ValueError as e:
            print(f"learner wrapper: {e}", file=sys.stderr, flush=True)
            ended = None
        patient = ended is not None and not ended.stopped
        if patient:
            errors = self.transfers.store(store, list(self.transfers.files_to_upload()))
        else:
            errors = self.transfers.store(store, self.transfers.log_only(), patient=False)
        self.save_checkpoints(store, patient=patient)
        if errors:
            print(f"learner {learner} could not store its files: {errors[0]}", file=sys.stderr)
            return pod_io.Stored(False, errors[0])
        return pod_io.Stored(True)

    def save_checkpoints(self, store: ObjectStore, *, patient: bool) -> None:
        """CHECKPOINT_DIR's regular files to the spec's checkpoints_prefix (read through
        service.tenantfs: links, hard-linked and special files skipped, as the local
        backend saves it); after a stop, each file is tried once, within what is left of
        the grace period."""
        try:
            files = self.transfers.checkpoint_files()
        except OSError as e:
            print(f"learner wrapper: CHECKPOINT_DIR cannot be read: {e}", file=sys.stderr)
            return
        if errors := self.transfers.upload(store, files, patient=patient):
            print(
                f"learner {self.spec.learner_id} could not save its checkpoints: {errors[0]}",
                file=sys.stderr,
                flush=True,
            )

    def wait_until_stopped(self) -> None:
        while not self.stopping:
            time.sleep(0.2)


def agent(spec_path: Path, io_dir: Path, private_dir: Path, termination_log: str) -> int:
    """Tee, store, answer, then wait for the kubelet's SIGTERM; 0, EXIT_STOPPED when
    stopped before the command ended (the log alone stored, no answer), or
    EXIT_PLATFORM_ERROR when it cannot work at all (its answer then says so, so `run` does
    not wait for it)."""
    try:
        spec, store, log_store = _setup(spec_path)
        sidecar = Agent(spec, io_dir, private_dir)
    except (PlatformError, OSError) as e:
        try:
            io_dir.mkdir(parents=True, exist_ok=True)
            pod_io.Stored(False, str(e)).write(io_dir)
        except OSError as answer:
            print(f"learner wrapper: cannot answer in {io_dir}: {answer}", file=sys.stderr)
        return _fail(termination_log, str(e))
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, sidecar.on_signal)
    # LOG_DIR (the `work` volume the agent mounts) synced while the command runs, as the
    # local wrapper does, with the TensorBoard metrics where the manifest asks for them.
    # The metric regexes' points are stored with those syncs (and once more at the end).
    metrics = LogMetrics(spec.learner_id, spec.log_metrics) if spec.log_metrics else None
    sync = LogDirSync(spec, sidecar.transfers, store, metrics)
    sync.start()
    try:
        sidecar.tee(log_store, metrics)
    except Exception as e:  # what was read is in the learner's log: store that at least
        print(f"learner wrapper: following the output failed: {e}", file=sys.stderr)
    finally:
        sync.stop(last_pass=not sidecar.stopping)
    stored = sidecar.store(store)
    if sidecar.ended is None:
        # Stopped (or failed) before the command ended: the log is stored, but there is no
        # exit to answer; `run`, if it goes on, finds no answer and says so.
        return EXIT_STOPPED
    stored.write(io_dir)
    sidecar.wait_until_stopped()
    return EXIT_OK
