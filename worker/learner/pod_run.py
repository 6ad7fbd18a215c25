"""The learner container's step: `python -m worker.learner.pod run --io IO [--wait-for
HOST:PORT ...] -- ARGV...`, in the runtime's image, with no credentials.

Standard library only (and the learner package's own stdlib modules): the runtime's
image has its framework's packages, none of the platform's. It copies the training's key
pair into $HOME/.ssh (MPI), waits until the peers it names accept connections, runs ARGV
in MODEL_DIR with the pod's environment as one process group, appends its output to the
`io` volume (worker.learner.pod_io) and echoes it to its own stdout (the pod log: the
fallback when the agent cannot send it), forwards SIGTERM to the group (SIGKILL after the
grace), reaps the orphans a container's PID 1 inherits, writes the exit file, waits for
the agent to store the results and logs, and exits with the command's code, so the pod's
container state carries the learner's exit.

Exit codes: the command's own (128 + N when signal N killed it); when the step itself
fails, one of the EXIT_* codes below with the reason in the termination message (a
command that fails with its own code leaves no termination message unless storing also
failed).
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from types import FrameType

from worker.learner import pod_io
from worker.learner.supervision import Supervisor, describe_exit

# The command succeeded, but its results and logs could not be stored (or the agent did
# not answer within the store timeout).
EXIT_NOT_STORED = 121
# A --wait-for endpoint did not accept connections within the wait timeout.
EXIT_PEERS_UNREACHABLE = 122
# The command could not be started (not found, not executable, no MODEL_DIR).
EXIT_CANNOT_START = 123

# Where the pod mounts the training's key pair (worker.backends.kubernetes.layout.SSH_DIR,
# which this module cannot import: a unit test keeps the two the same).
SSH_DIR = "/var/run/dlaas/ssh"
SSH_KEY_NAMES = ("id_ed25519", "id_ed25519.pub", "authorized_keys")

WAIT_TIMEOUT_SECONDS = 300.0
STORE_TIMEOUT_SECONDS = 600.0
STOP_GRACE_SECONDS = 10.0
_DRAIN_SECONDS = 5.0  # output still arriving after the command's exit (its stragglers)
_CONNECT_SECONDS = 2.0
_REAP_SECONDS = 0.5


@dataclass(frozen=True)
class RunOptions:
    io_dir: Path
    argv: list[str]
    wait_for: tuple[str, ...] = ()
    wait_timeout: float = WAIT_TIMEOUT_SECONDS
    store_timeout: float = STORE_TIMEOUT_SECONDS
    grace: float = STOP_GRACE_SECONDS
    ssh_dir: Path = Path(SSH_DIR)
    segment_bytes: int = pod_io.SEGMENT_BYTES
    termination_log: str = pod_io.TERMINATION_LOG


def exit_code(returncode: int) -> int:
    """The container's exit code for a command's return code (negative: its signal)."""
    return 128 - returncode if returncode < 0 else returncode


def install_ssh_keys(ssh_dir: Path, home: Path) -> bool:
    """Copy the key pair mounted at `ssh_dir` (read-only, root's) into home/.ssh with the
    modes ssh and sshd insist on; False when there is none (not an MPI training)."""
    present = [name for name in SSH_KEY_NAMES if (ssh_dir / name).is_file()]
    if not present:
        return False
    target = home / ".ssh"
    target.mkdir(parents=True, exist_ok=True)
    target.chmod(0o700)
    for name in present:
        path = target / name
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "wb") as out, open(ssh_dir / name, "rb") as src:
            shutil.copyfileobj(src, out)
        path.chmod(0o600)
    return True


def parse_endpoint(endpoint: str) -> tuple[str, int]:
    host, sep, port = endpoint.rpartition(":")
    if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise ValueError(f"--wait-for {endpoint!r}: HOST:PORT expected")
    return host.strip("[]"), int(port)


def wait_for_endpoints(
    endpoints: tuple[str, ...], timeout: float, stopped: threading.Event
) -> list[str]:
    """Wait until each endpoint resolves and accepts a TCP connection; returns those that
    did not within `timeout` s (empty: all did) and stops early when `stopped` is set."""
    deadline = time.monotonic() + timeout
    missing = list(endpoints)
    while missing and not stopped.is_set():
        for endpoint in list(missing):
            try:
                with socket.create_connection(parse_endpoint(endpoint), _CONNECT_SECONDS):
                    missing.remove(endpoint)
            except OSError:  # not resolvable yet, refused, unreachable
                pass
        if not missing or time.monotonic() >= deadline:
            break
        stopped.wait(0.5)
    return missing


def reap_orphans(command: int, done: threading.Event) -> None:
    """As its container's PID 1, `run` inherits every orphaned process: reap those that
    have exited, so none stays a zombie, but never the command (its Supervisor waits for
    it, and reaping it here would lose its exit code). Until `done` is set."""
    while not done.is_set():
        try:
            info = os.waitid(os.P_ALL, 0, os.WEXITED | os.WNOHANG | os.WNOWAIT)
        except ChildProcessError:
            info = None
        if info is not None and info.si_pid != command:
            with contextlib.suppress(ChildProcessError):
                os.waitpid(info.si_pid, 0)
            continue
        done.wait(_REAP_SECONDS)


class _Output:
    """Copies the command's output pipe to the segments and to this process's stdout."""

    def __init__(self, writer: pod_io.SegmentWriter) -> None:
        self.writer = writer
        self.lock = threading.Lock()
        self.closed = False
        self.kept = True  # the output goes to io
        self.echo = True  # and to this process's stdout
        self.thread: threading.Thread | None = None

    def line(self, text: str) -> None:
        """A line of the platform's own in the learner's log."""
        self.write((text + "\n").encode())

    def write(self, data: bytes) -> None:
        with self.lock:
            if self.closed:  # a straggler's output after the exit file: dropped
                return
            if self.kept:
                try:
                    self.writer.write(data)
                except OSError as e:
                    # The volume is full, say: the pod log keeps the rest, and the
                    # command's output is still read, so that it never blocks on it.
                    self.kept = False
                    print(f"learner: writing the output to {self.writer.io_dir} failed: {e}",
                          file=sys.stderr, flush=True)  # fmt: skip
        if self.echo:
            try:
                sys.stdout.buffer.write(data)
                sys.stdout.buffer.flush()
            except (OSError, ValueError):
                self.echo = False

    def copy(self, fd: int) -> None:
        def read() -> None:
            try:
                while chunk := os.read(fd, 64 * 1024):
                    self.write(chunk)
            except OSError as e:
                print(f"learner: reading the command's output failed: {e}", file=sys.stderr)
            finally:
                os.close(fd)

        self.thread = threading.Thread(target=read, name="output", daemon=True)
        self.thread.start()

    def close(self, drain: float) -> None:
        if self.thread is not None:
            self.thread.join(drain)
        with self.lock:
            self.closed = True
            self.writer.close()


class RunStep:
    def __init__(self, options: RunOptions) -> None:
        self.options = options
        self.learner = os.environ.get("LEARNER_ID", "?")
        self.supervisor = Supervisor(options.grace)
        self.stopped = threading.Event()
        self.returncode: int | None = None  # the command's, once it has run
        # Stopped before or while the command ran (a stop after its end changes nothing:
        # its results are stored as usual).
        self.halted = False

    def on_signal(self, signum: int, frame: FrameType | None) -> None:
        self.stopped.set()
        self.supervisor.request_stop()

    def run(self) -> int:
        for sig in (signal.SIGTERM, signal.SIGINT):
            signal.signal(sig, self.on_signal)
        opts = self.options
        try:
            output = _Output(pod_io.SegmentWriter(opts.io_dir, opts.segment_bytes))
        except OSError as e:
            unwritable = f"learner {self.learner}: its output cannot go to {opts.io_dir}: {e}"
            print(f"learner: {unwritable}", file=sys.stderr, flush=True)
            pod_io.write_termination_message(opts.termination_log, unwritable)
            return EXIT_CANNOT_START
        code, reason = self.run_command(output)
        output.close(_DRAIN_SECONDS)
        pod_io.Exit(code, self.halted).write(opts.io_dir)
        stored = self.wait_stored()
        if stored is None or not stored.ok:
            why = (
                f"the agent did not store them within {opts.store_timeout:g} s"
                if stored is None
                else stored.reason or "no reason given"
            )
            not_stored = f"learner {self.learner} could not store its files: {why}"
            if reason is None and code == 0:
                code, reason = EXIT_NOT_STORED, not_stored
            elif reason is None:
                reason = f"{self._describe(code)}; storing its files also failed: {why}"
            else:
                reason += f"; storing its files also failed: {why}"
        if reason is not None:
            print(f"learner: {reason}", file=sys.stderr, flush=True)
            pod_io.write_termination_message(opts.termination_log, reason)
        return code

    def _describe(self, code: int) -> str:
        learner = int(self.learner) if self.learner.isdigit() else 0
        returncode = code if self.returncode is None else self.returncode
        return describe_exit(learner, returncode, killed_by_us=self.supervisor.kill_sent)

    def run_command(self, output: _Output) -> tuple[int, str | None]:
        """The command's exit code, and the reason when the step itself failed."""
        opts = self.options
        home = Path(os.environ.get("HOME") or os.path.expanduser("~"))
        try:
            install_ssh_keys(opts.ssh_dir, home)
        except OSError as e:
            reason = f"learner {self.learner}: the SSH keys could not be installed: {e}"
            output.line(f"[dlaas] {reason}")
            return EXIT_CANNOT_START, reason
        if opts.wait_for:
            print(f"learner: waiting for {', '.join(opts.wait_for)}", file=sys.stderr, flush=True)
            missing = wait_for_endpoints(opts.wait_for, opts.wait_timeout, self.stopped)
            if self.stopped.is_set():
                self.halted = True
                return exit_code(-signal.SIGTERM), None
            if missing:
                reason = (
                    f"learner {self.learner}: the other learners did not accept connections "
                    f"within {opts.wait_timeout:g} s; still missing: {', '.join(missing)}"
                )
                output.line(f"[dlaas] {reason}")
                return EXIT_PEERS_UNREACHABLE, reason
        if self.stopped.is_set():
            self.halted = True
            return exit_code(-signal.SIGTERM), None
        cwd = os.environ.get("MODEL_DIR") or os.getcwd()
        try:
            proc = self.supervisor.start(opts.argv, cwd=cwd, env=dict(os.environ))
        except (OSError, ValueError, subprocess.SubprocessError) as e:
            reason = f"learner {self.learner} could not start its command: {e}"
            output.line(f"[dlaas] {reason}")
            return EXIT_CANNOT_START, reason
        assert proc.stdout is not None
        output.copy(os.dup(proc.stdout.fileno()))
        proc.stdout.close()
        reaped = threading.Event()
        if os.getpid() == 1:
            reaper = threading.Thread(target=reap_orphans, args=(proc.pid, reaped), daemon=True)
            reaper.start()
        try:
            # A stop that came while the command started is forwarded by supervise().
            self.returncode, self.halted = self.supervisor.supervise()
        finally:
            reaped.set()
        return exit_code(self.returncode), None

    def wait_stored(self) -> pod_io.Stored | None:
        deadline = time.monotonic() + self.options.store_timeout
        while time.monotonic() < deadline:
            with contextlib.suppress(ValueError):  # half-written by hand: read again
                stored = pod_io.Stored.read(self.options.io_dir)
                if stored is not None:
                    return stored
            time.sleep(pod_io.POLL_SECONDS)
        return None


def run(options: RunOptions) -> int:
    """Run the learner's command to its end; returns the container's exit code."""
    return RunStep(options).run()
