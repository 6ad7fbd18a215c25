"""The learner wrapper: what runs inside every learner (a local process or a pod's container).

`python -m worker.learner SPEC` fetches and unpacks the code and downloads the training data
from the user's bucket, if any (DOWNLOADING, with progress in the status message), meets the
other learners if asked to, runs the command (RUNNING) while teeing its output line by line
to the live log store and to a private training-log.txt, uploads results and logs to the
platform's store and to the user's results bucket, if any (STORING), and records the outcome
(COMPLETED, FAILED or HALTED). Each phase is written atomically to the spec's status file,
which the platform's monitor reads. Credentials come only from the spec file (mode 0600).

Exit codes: 0 the command succeeded; 1 it failed; 2 a platform error (message in the status
file); 143 stopped by SIGTERM/SIGINT.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import socket
import stat
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from types import FrameType
from typing import TYPE_CHECKING

from service import storage
from service.domain.states import TrainingState
from service.logs import open_log_store
from service.logs.base import LogRecord, LogStore, iso_utc
from service.storage import keys
from service.storage.archives import UnsafeArchiveError, extract_archive
from service.storage.base import (
    ObjectNotFound,
    ObjectStore,
    StoreUnavailable,
    check_key,
    directory_prefix,
)
from service.storage.config import StoreConfig
from worker.learner.spec import LearnerSpec

if TYPE_CHECKING:
    from service.storage.s3 import S3ObjectStore

EXIT_OK = 0
EXIT_COMMAND_FAILED = 1
EXIT_PLATFORM_ERROR = 2
EXIT_HALTED = 143

MAX_LINE_BYTES = 64 * 1024  # longer lines are split into records of at most this size
_READ_CHUNK = 64 * 1024
_MAX_PENDING_BYTES = 4 * 1024 * 1024  # read but not yet written; beyond it the reader waits
_POLL_SECONDS = 0.05
_TEE_DRAIN_SECONDS = 5.0  # how long to wait for the output pipe to close after the command
_MAX_UPLOAD_ERRORS = 10
_CHUNK = 1024 * 1024
_PROGRESS_SECONDS = 0.5  # how often the data download reports its progress


class PlatformError(Exception):
    """Something outside the user's command went wrong; str(err) says what to do about it."""


class _Stopped(BaseException):
    """Raised by the signal handler to abandon the preparation phases."""


def open_store(config: StoreConfig) -> ObjectStore:
    """The object store described by `config`; raises PlatformError if it cannot be built."""
    try:
        return storage.open_store(config)
    except storage.StoreConfigError as e:
        raise PlatformError(str(e)) from e


def open_bucket(config: StoreConfig) -> S3ObjectStore:
    """A user's S3 bucket; PlatformError if the config is unusable."""
    from service.storage.s3 import S3ObjectStore  # a learner with local stores needs no minio

    if config.kind != "s3":
        raise PlatformError("the learner spec names a user's bucket that is not an S3 store")
    store = open_store(config)
    assert isinstance(store, S3ObjectStore)  # open_store opens an s3 config as S3
    return store


def _size(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if n < 1024 or unit == "GiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n:.1f} TiB"  # pragma: no cover - the loop returns


def notify(socket_path: str | None, training_id: str) -> None:
    """Tell the backend's monitor that a status file changed, so it need not poll fast to
    see it. Best effort: when nobody listens, the monitor's polling still finds it."""
    if not socket_path:
        return
    try:
        with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as sock:
            sock.setblocking(False)
            sock.sendto(training_id.encode(), socket_path)
    except OSError:
        pass


def write_status(
    path: Path,
    phase: TrainingState,
    *,
    exit_code: int | None = None,
    message: str | None = None,
    child_pid: int | None = None,
    phases: dict[str, float] | None = None,
) -> None:
    """Replace the status file atomically with the phase, this process's pid and the time.

    `child_pid` is the running command's pid, which is also its process group id: a backend
    can still stop the command with it if this wrapper dies. `phases` says when each phase
    began, so a monitor that polls still records the phases it did not see.
    """
    data = {
        "phase": phase.value,
        "pid": os.getpid(),
        "child_pid": child_pid,
        "exit_code": exit_code,
        "message": message,
        "updated_at": time.time(),
        "phases": phases or {},
    }
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".status-")
    try:
        os.fchmod(fd, 0o644)
        with os.fdopen(fd, "w") as f:
            json.dump(data, f)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def split_lines(buffer: bytes) -> tuple[list[bytes], bytes]:
    """Complete lines of `buffer` (without their newline) and the incomplete rest.

    A line longer than MAX_LINE_BYTES is cut into pieces of at most that size, at a UTF-8
    character boundary where there is one nearby, so the rest never exceeds it.
    """
    lines: list[bytes] = []
    start = 0
    while True:
        newline = buffer.find(b"\n", start, start + MAX_LINE_BYTES + 1)
        if newline != -1:
            lines.append(buffer[start:newline])
            start = newline + 1
        elif len(buffer) - start > MAX_LINE_BYTES:
            cut = start + MAX_LINE_BYTES
            while cut > start + MAX_LINE_BYTES - 3 and buffer[cut] & 0xC0 == 0x80:
                cut -= 1  # do not split a multi-byte character
            lines.append(buffer[start:cut])
            start = cut
        else:
            return lines, buffer[start:]


class LogTee:
    """Reads a command's output and writes each line to a log store and a local file.

    One thread reads the pipe and cuts lines, stamping each with the time it was read;
    another writes whatever has accumulated as one batch, as soon as there is something,
    so lines reach the store within the store's own latency and batches grow only when the
    store is slower than the command. At most _MAX_PENDING_BYTES are held in memory.
    """

    def __init__(self, learner: int, training_id: str, store: LogStore, local_file: Path) -> None:
        self._fd = -1
        self._learner = learner
        self._training_id = training_id
        self._store = store
        self._local = os.open(local_file, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_APPEND)
        self._cond = threading.Condition()
        self._pending: list[LogRecord] = []
        self._pending_bytes = 0
        self._eof = False
        self._closed = False
        self._warned: set[str] = set()
        self._reader = threading.Thread(target=self._read, name="log-reader", daemon=True)
        self._writer = threading.Thread(target=self._write, name="log-writer", daemon=True)

    def start(self, fd: int) -> None:
        """Start reading `fd` (the tee owns it from now on and closes it at its end)."""
        self._fd = fd
        self._reader.start()
        self._writer.start()

    def close(self, timeout: float) -> None:
        """Wait up to `timeout` s for the output to end, then write what was read; idempotent."""
        started = self._reader.ident is not None
        if started:
            self._reader.join(timeout)
        with self._cond:
            self._eof = self._closed = True  # lines of a straggler holding the pipe are dropped
            self._cond.notify_all()
        if started:
            self._writer.join()
        with contextlib.suppress(OSError):
            os.close(self._local)

    def _read(self) -> None:
        rest = b""
        try:
            while chunk := os.read(self._fd, _READ_CHUNK):
                lines, rest = split_lines(rest + chunk)
                self._put(lines)
            if rest:
                self._put([rest])
        except OSError as e:
            self._warn("read", f"reading the command's output failed: {e}")
        finally:
            # Closed here, not by close(): were it closed while this thread still reads, the
            # number could be reused and this thread would read someone else's file.
            os.close(self._fd)
            with self._cond:
                self._eof = True
                self._cond.notify_all()

    def _put(self, lines: list[bytes]) -> None:
        now = time.time()
        with self._cond:
            while self._pending_bytes > _MAX_PENDING_BYTES and not self._closed:
                self._cond.wait()
            if self._closed:
                return
            for raw in lines:
                line = raw.removesuffix(b"\r").decode("utf-8", "replace")
                self._pending.append(LogRecord(self._learner, now, line))
                self._pending_bytes += len(raw)
            self._cond.notify_all()

    def _write(self) -> None:
        while True:
            with self._cond:
                while not self._pending and not self._eof:
                    self._cond.wait()
                batch, self._pending, self._pending_bytes = self._pending, [], 0
                self._cond.notify_all()
            if not batch:
                return
            self._emit(batch)

    def _emit(self, batch: list[LogRecord]) -> None:
        text = "".join(f"{iso_utc(r.ts)} {r.line}\n" for r in batch).encode("utf-8", "replace")
        try:
            while text:
                text = text[os.write(self._local, text) :]
        except OSError as e:
            self._warn("file", f"writing {keys.LEARNER_LOG_NAME} failed: {e}")
        try:
            self._store.append(self._training_id, batch)
        except Exception as e:  # the live log is a convenience; training-log.txt is the record
            self._warn("store", f"the live log store is unavailable, lines are missing: {e}")

    def _warn(self, what: str, message: str) -> None:
        if what not in self._warned:
            self._warned.add(what)
            print(f"learner wrapper: {message}", file=sys.stderr, flush=True)


def _tree_files(root: Path, prefix: str) -> Iterator[tuple[str, Path]]:
    """(key, real path) of every regular file under root, keys = prefix + relative path.

    Symbolic links are followed only to files inside root; directories behind symbolic
    links are not entered. Special files (FIFOs, sockets) are skipped.
    """
    real_root = os.path.realpath(root)
    if not os.path.isdir(real_root):
        return
    for dirpath, dirnames, filenames in os.walk(real_root):
        dirnames.sort()
        for name in sorted(filenames):
            path = os.path.join(dirpath, name)
            real = os.path.realpath(path)
            if os.path.commonpath([real_root, real]) != real_root:
                continue
            try:
                if not stat.S_ISREG(os.stat(real).st_mode):
                    continue
            except OSError:
                continue  # a dangling link
            yield prefix + Path(path).relative_to(real_root).as_posix(), Path(real)


def describe_exit(learner: int, code: int, *, killed_by_us: bool = False) -> str:
    """A sentence about a failed command's return code (negative: killed by that signal)."""
    if code >= 0:
        message = f"learner {learner} exited with code {code}"
        if code == 128 + signal.SIGKILL and not killed_by_us:
            message += " (killed by SIGKILL: out of memory?)"
        return message
    try:
        name = signal.Signals(-code).name
    except ValueError:
        name = f"signal {-code}"
    message = f"learner {learner} was killed by signal {name}"
    if -code == signal.SIGKILL and not killed_by_us:
        message += " (out of memory?)"
    return message


class _Learner:
    def __init__(self, spec: LearnerSpec) -> None:
        self.spec = spec
        self.status_path = Path(spec.status_file)
        self.private_dir = self.status_path.parent
        self.log_path = self.private_dir / keys.LEARNER_LOG_NAME
        self.phase: TrainingState | None = None
        self.interruptible = False  # whether a stop abandons the current phase at once
        self.stop_requested = False
        self.child: subprocess.Popen[bytes] | None = None
        self.term_sent_at: float | None = None
        self.kill_sent = False
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
        write_status(
            self.status_path,
            phase,
            exit_code=exit_code,
            message=message,
            child_pid=child_pid,
            phases=self.phase_times,
        )
        self.phase = phase
        notify(self.spec.notify_socket, self.spec.training_id)

    def on_signal(self, signum: int, frame: FrameType | None) -> None:
        self.stop_requested = True
        if self.interruptible:
            self.interruptible = False
            raise _Stopped
        self.forward_term()

    def forward_term(self) -> None:
        if self.child is not None and self.term_sent_at is None:
            self.term_sent_at = time.monotonic()
            _killpg(self.child.pid, signal.SIGTERM)

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
        if self.stop_requested:
            raise _Stopped
        store = open_store(spec.store)
        try:
            sink = spec.log_sink
            log_store = open_log_store(sink.kind, dir=sink.dir, url=sink.url)
        except ValueError as e:
            raise PlatformError(f"the learner spec's log sink is unusable: {e}") from e
        self.fetch_code(store)
        try:
            for d in (spec.data_dir, spec.result_dir, spec.log_dir, spec.checkpoint_dir):
                Path(d).mkdir(parents=True, exist_ok=True)
        except OSError as e:
            raise PlatformError(f"the learner's directories could not be created: {e}") from e
        self.check_results_target()
        self.fetch_data()
        try:
            if spec.ready_file:
                Path(spec.ready_file).parent.mkdir(parents=True, exist_ok=True)
                Path(spec.ready_file).touch()
        except OSError as e:
            raise PlatformError(f"the learner's directories could not be created: {e}") from e
        self.wait_for_peers()
        self.interruptible = False
        if self.stop_requested:
            raise _Stopped
        return self.run_command(store, log_store)

    def fetch_code(self, store: ObjectStore) -> None:
        key = self.spec.model_definition_key
        self.private_dir.mkdir(parents=True, exist_ok=True)
        fd, name = tempfile.mkstemp(dir=self.private_dir, prefix=".model_definition-")
        archive = Path(name)
        try:
            try:
                with os.fdopen(fd, "wb") as out, store.open(key) as src:
                    shutil.copyfileobj(src, out, _CHUNK)
            except ObjectNotFound as e:
                raise PlatformError(f"the code archive {key} is not in the object store") from e
            except Exception as e:
                raise PlatformError(f"the code archive {key} could not be downloaded: {e}") from e
            try:
                extract_archive(archive, Path(self.spec.model_dir))
            except (UnsafeArchiveError, OSError) as e:
                raise PlatformError(f"the code archive could not be unpacked: {e}") from e
        finally:
            archive.unlink(missing_ok=True)

    def check_results_target(self) -> None:
        """Fail now, not after the run, if the user's results bucket cannot be used."""
        target = self.spec.results_target
        if target is None:
            return
        try:
            open_bucket(target.store).check_bucket()
        except StoreUnavailable as e:
            raise PlatformError(f"the training results bucket cannot be used: {e}") from e

    def fetch_data(self) -> None:
        """Download the training data (every object below the source prefix) into
        data_dir, keeping the paths below the prefix; progress goes to the status file."""
        location = self.spec.training_data
        if location is None:
            return
        source = open_bucket(location.store)
        try:
            prefix = directory_prefix(location.prefix)
        except ValueError as e:
            raise PlatformError(f"the training data prefix {location.prefix!r} is invalid") from e
        where = source.description + (f" under {prefix!r}" if prefix else "")
        self.status(TrainingState.DOWNLOADING, message=f"downloading training data from {where}")
        try:
            objects = list(source.list(prefix))
        except StoreUnavailable as e:
            raise PlatformError(f"the training data cannot be read: {e}") from e
        data_dir = Path(self.spec.data_dir)
        total = sum(o.size for o in objects)
        done = 0
        reported = time.monotonic()
        for count, obj in enumerate(objects, 1):
            relative = obj.key[len(prefix) :]
            try:
                check_key(relative)
            except ValueError as e:
                raise PlatformError(
                    f"the training data object {obj.key!r} has a name that cannot be a file"
                ) from e
            target = data_dir / relative
            try:
                target.parent.mkdir(parents=True, exist_ok=True)
                fd, tmp = tempfile.mkstemp(dir=target.parent, prefix=".download-")
            except OSError as e:
                raise PlatformError(f"the training data cannot be written: {e}") from e
            try:
                with os.fdopen(fd, "wb") as out, source.open(obj.key) as src:
                    shutil.copyfileobj(src, out, _CHUNK)
                os.replace(tmp, target)
            except (ObjectNotFound, StoreUnavailable) as e:
                why = f"{obj.key} disappeared" if isinstance(e, ObjectNotFound) else str(e)
                raise PlatformError(f"the training data could not be downloaded: {why}") from e
            except OSError as e:
                raise PlatformError(f"the training data cannot be written: {e}") from e
            finally:
                Path(tmp).unlink(missing_ok=True)
            done += obj.size
            if time.monotonic() - reported >= _PROGRESS_SECONDS:
                reported = time.monotonic()
                self.status(
                    TrainingState.DOWNLOADING,
                    message=f"downloading training data from {where}: {count} of "
                    f"{len(objects)} files, {_size(done)} of {_size(total)}",
                )
        self.status(
            TrainingState.DOWNLOADING,
            message=f"downloaded the training data from {where}: {len(objects)} files, "
            f"{_size(total)}",
        )

    def wait_for_peers(self) -> None:
        deadline = time.monotonic() + self.spec.wait_timeout
        while missing := [p for p in self.spec.wait_for if not os.path.exists(p)]:
            if time.monotonic() >= deadline:
                raise PlatformError(
                    f"learner {self.spec.learner_id}: the other learners were not ready within "
                    f"{self.spec.wait_timeout:g} s; still missing: {', '.join(missing)}"
                )
            time.sleep(_POLL_SECONDS)

    def run_command(self, store: ObjectStore, log_store: LogStore) -> int:
        spec = self.spec
        self.private_dir.mkdir(parents=True, exist_ok=True)
        tee = LogTee(spec.learner_id, spec.training_id, log_store, self.log_path)
        try:
            proc = subprocess.Popen(
                spec.argv,
                cwd=spec.model_dir,
                env=spec.env,
                stdin=subprocess.DEVNULL,
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
                start_new_session=True,  # its own process group, signalled as a whole
            )
        except (OSError, ValueError) as e:
            tee.close(0)
            raise PlatformError(
                f"learner {spec.learner_id} could not start its command: {e}"
            ) from e
        assert proc.stdout is not None
        self.child = proc
        try:
            self.status(TrainingState.RUNNING, child_pid=proc.pid)
            tee.start(os.dup(proc.stdout.fileno()))
            proc.stdout.close()
            code, halted = self.supervise(proc)
        finally:
            if self.child is not None:  # supervision failed: leave nothing running
                _killpg(proc.pid, signal.SIGKILL)
                proc.wait()
                self.child = None
            tee.close(_TEE_DRAIN_SECONDS)
        if halted:
            # The log is small and matters most now; results of an interrupted run do not.
            log_only = [(self.log_key(), self.log_path)]
            self.upload(store, log_only)
            self.copy_to_target(log_only)
            message = f"learner {spec.learner_id} was stopped"
            if self.kill_sent:
                grace = f"{spec.stop_grace_seconds:g} s"
                message += f"; its command did not stop within {grace} of SIGTERM and was killed"
            self.status(TrainingState.HALTED, exit_code=code, message=message)
            return EXIT_HALTED
        self.status(TrainingState.STORING)
        files = list(self.files_to_upload())
        errors = self.upload(store, files)
        errors += self.copy_to_target(files)
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

    def supervise(self, proc: subprocess.Popen[bytes]) -> tuple[int, bool]:
        """Wait for the command; on a stop, TERM its group and KILL it after the grace.

        Returns the return code and whether the command was stopped. Whatever the command
        left running in its group is killed once it exits (as a container's end would).
        """
        exited = threading.Event()

        def wait_without_reaping() -> None:
            # An unreaped leader keeps its process group id from being reused, so the group
            # can be killed safely after it exits.
            with contextlib.suppress(ChildProcessError):
                os.waitid(os.P_PID, proc.pid, os.WEXITED | os.WNOWAIT)
            exited.set()

        threading.Thread(target=wait_without_reaping, name="child-wait", daemon=True).start()
        grace = self.spec.stop_grace_seconds
        while not exited.wait(_POLL_SECONDS):
            if self.stop_requested:
                self.forward_term()
                sent = self.term_sent_at
                if not self.kill_sent and sent is not None and time.monotonic() >= sent + grace:
                    self.kill_sent = True
                    _killpg(proc.pid, signal.SIGKILL)
        halted = self.stop_requested
        _killpg(proc.pid, signal.SIGKILL)
        self.child = None
        return proc.wait(), halted

    def log_key(self) -> str:
        return keys.learner_log_key(self.results_prefix(), self.spec.learner_id)

    def results_prefix(self) -> str:
        prefix = self.spec.results_prefix
        return prefix if not prefix or prefix.endswith("/") else prefix + "/"

    def files_to_upload(self) -> Iterator[tuple[str, Path]]:
        spec = self.spec
        if self.log_path.is_file():
            yield self.log_key(), self.log_path
        learner_prefix = keys.learner_logs_prefix(self.results_prefix(), spec.learner_id)
        yield from _tree_files(Path(spec.log_dir), learner_prefix)
        if spec.upload_results:
            yield from _tree_files(Path(spec.result_dir), self.results_prefix())

    def upload(
        self, store: ObjectStore, files: Iterator[tuple[str, Path]] | Sequence[tuple[str, Path]]
    ) -> list[str]:
        """Upload each file; returns what failed, after at most _MAX_UPLOAD_ERRORS failures."""
        errors: list[str] = []
        for key, path in files:
            try:
                store.put_file(key, path)
            except Exception as e:
                errors.append(f"{key}: {e}")
                # The store itself is failing: the other files would fail the same way.
                if isinstance(e, StoreUnavailable) or len(errors) >= _MAX_UPLOAD_ERRORS:
                    break
        return errors

    def copy_to_target(self, files: Sequence[tuple[str, Path]]) -> list[str]:
        """Upload the files also to the user's results bucket, if the manifest names one:
        the same paths below training-<id>/ as below the results prefix."""
        target = self.spec.results_target
        if target is None:
            return []
        try:
            store = open_bucket(target.store)
            prefix = directory_prefix(target.prefix)
        except (PlatformError, ValueError) as e:
            return [f"the training results bucket cannot be used: {e}"]
        ours = self.results_prefix()
        copies = [(prefix + key[len(ours) :], path) for key, path in files if key.startswith(ours)]
        return [f"copying to the results bucket: {e}" for e in self.upload(store, copies)]


def _killpg(pgid: int, sig: signal.Signals) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, sig)


def run_learner(spec: LearnerSpec) -> int:
    """Run one learner to its end; returns the wrapper's exit code (see the module doc)."""
    return _Learner(spec).run()


def main(argv: Sequence[str] | None = None) -> int:
    """`python -m worker.learner SPEC`; returns the exit code."""
    args = list(sys.argv[1:] if argv is None else argv)
    if len(args) != 1:
        print("usage: python -m worker.learner SPEC.json", file=sys.stderr)
        return EXIT_PLATFORM_ERROR
    try:
        spec = LearnerSpec.read(Path(args[0]))
    except (OSError, ValueError) as e:
        print(f"learner wrapper: cannot read the learner spec {args[0]}: {e}", file=sys.stderr)
        return EXIT_PLATFORM_ERROR
    return run_learner(spec)
