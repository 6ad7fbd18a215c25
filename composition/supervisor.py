"""The embedded Celery worker: one child process of `dlaas up`, restarted if it dies.

Celery wants a process of its own (its main thread, its signal handlers, its pool), so
`dlaas up` supervises one: started with the platform, restarted (with a back-off) if it
dies, stopped on Ctrl-C, and killed by the kernel if `dlaas up` itself is killed
(PR_SET_PDEATHSIG). Its output goes to `$DLAAS_HOME/worker.log`.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import IO

from service.private import FILE_MODE

# Python run as the worker's first program: ask the kernel to SIGTERM it when `dlaas up`
# dies, then become `python -m worker` (the request survives exec).
_WORKER_BOOT = """
import ctypes, os, signal, sys
try:
    ctypes.CDLL(None, use_errno=True).prctl(1, int(signal.SIGTERM))  # PR_SET_PDEATHSIG
except (OSError, AttributeError):
    pass
if os.getppid() != int(sys.argv[1]):
    sys.exit(0)
os.execv(sys.executable, [sys.executable, "-m", "worker"])
"""


def _owner_only(path: str, flags: int) -> int:
    return os.open(path, flags, FILE_MODE)


class WorkerSupervisor:
    """The embedded Celery worker: one child process, restarted if it dies.

    All its methods run in the main thread (the kernel ties PR_SET_PDEATHSIG to the thread
    that started the child).
    """

    MIN_BACKOFF = 1.0
    MAX_BACKOFF = 30.0
    HEALTHY_AFTER = 60.0

    def __init__(self, log_path: Path, echo: Callable[[str], None]) -> None:
        self.log_path = log_path
        self.echo = echo
        self.proc: subprocess.Popen[bytes] | None = None
        self.restarts = 0
        self._started_at = 0.0
        self._backoff = self.MIN_BACKOFF
        self._restart_at: float | None = None
        self._log: IO[bytes] | None = None

    def start(self) -> None:
        if self._log is None:
            # Kept for the child's life; owner-only, like everything in DLAAS_HOME.
            self._log = open(self.log_path, "ab", opener=_owner_only)  # noqa: SIM115
        self.proc = subprocess.Popen(
            [sys.executable, "-c", _WORKER_BOOT, str(os.getpid())],
            stdin=subprocess.DEVNULL,
            stdout=self._log,
            stderr=self._log,
            start_new_session=True,  # Ctrl-C in the terminal reaches `dlaas up` only
        )
        self._started_at = time.monotonic()
        self._restart_at = None

    def check(self) -> None:
        """Restart the worker if it has exited (after a back-off that grows while it keeps
        dying young)."""
        if self.proc is None:
            return
        code = self.proc.poll()
        if code is None:
            return
        now = time.monotonic()
        if self._restart_at is None:
            if now - self._started_at > self.HEALTHY_AFTER:
                self._backoff = self.MIN_BACKOFF
            self._restart_at = now + self._backoff
            self.echo(
                f"the worker exited with code {code}; restarting it in {self._backoff:.0f} s "
                f"(see {self.log_path})"
            )
            self._backoff = min(self._backoff * 2, self.MAX_BACKOFF)
        if now >= self._restart_at:
            self.restarts += 1
            self.start()

    def terminate(self) -> None:
        """Ask the worker to stop (SIGTERM: Celery finishes the task it runs, then exits)."""
        proc = self.proc
        if proc is not None and proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGTERM)

    def stop(self, timeout: float = 30.0) -> None:
        """Stop the worker and wait for it: SIGTERM, SIGKILL after `timeout` seconds."""
        self.terminate()
        proc = self.proc
        if proc is not None and proc.poll() is None:
            try:
                proc.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
        if self._log is not None:
            self._log.close()
            self._log = None
