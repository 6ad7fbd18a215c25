"""The framework runtimes on the embedded platform (`dlaas up`, one user).

A training whose runtime is not installed is accepted there and installs it on its first
use, its progress in the training's status_message (DLAAS_RUNTIME_AUTO_INSTALL, which
`dlaas up` turns on unless the operator set it: `embedded_defaults`). `dlaas up
--install-runtimes` also starts building every runtime at start-up, in the background
(`RuntimeBuilds`): a child process, `dlaas runtimes install`, whose output goes to
`$DLAAS_HOME/runtimes-install.log`. A launch that needs a runtime it is building waits
for that build (the install's lock, service.runtimes) instead of starting another. The
child is stopped with `dlaas up` (its process group) and dies with it
(PR_SET_PDEATHSIG); a runtime it left half-built is never used (its marker is written last).
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import IO

from service.private import FILE_MODE

AUTO_INSTALL = "DLAAS_RUNTIME_AUTO_INSTALL"

# The child's first program: ask the kernel to SIGTERM it when `dlaas up` dies, then become
# `dlaas runtimes install` (the request survives exec).
_BUILDS_BOOT = """
import ctypes, os, signal, sys
try:
    ctypes.CDLL(None, use_errno=True).prctl(1, int(signal.SIGTERM))  # PR_SET_PDEATHSIG
except (OSError, AttributeError):
    pass
if os.getppid() != int(sys.argv[1]):
    sys.exit(0)
os.execv(sys.executable, [sys.executable, "-m", "dlaas.cli", "runtimes", "install"])
"""


def embedded_defaults(environ: Mapping[str, str]) -> dict[str, str]:
    """The settings `dlaas up` sets where the operator has not: runtimes installed on their
    first use (one user on one machine: a Horovod training waits for its build rather than
    being refused). Set in the environment, so the worker child reads them too."""
    return {} if environ.get(AUTO_INSTALL) else {AUTO_INSTALL: "true"}


def _owner_only(path: str, flags: int) -> int:
    return os.open(path, flags, FILE_MODE)


class RuntimeBuilds:
    """`dlaas runtimes install` (every runtime) as a child process of `dlaas up`, started at
    start-up. All its methods run in the main thread."""

    def __init__(
        self,
        log_path: Path,
        echo: Callable[[str], None],
        argv: list[str] | None = None,
    ) -> None:
        self.log_path = log_path
        self.echo = echo
        self.argv = argv or [sys.executable, "-c", _BUILDS_BOOT, str(os.getpid())]
        self.proc: subprocess.Popen[bytes] | None = None
        self.returncode: int | None = None
        self._log: IO[bytes] | None = None

    def start(self) -> None:
        self._log = open(self.log_path, "ab", opener=_owner_only)  # noqa: SIM115
        self.proc = subprocess.Popen(
            self.argv,
            stdin=subprocess.DEVNULL,
            stdout=self._log,
            stderr=self._log,
            start_new_session=True,  # Ctrl-C reaches `dlaas up`, which stops it
        )
        self.echo(f"  runtimes:      building every runtime in the background ({self.log_path})")

    def check(self) -> None:
        """Say once that the builds ended, and how."""
        if self.proc is None or self.returncode is not None:
            return
        code = self.proc.poll()
        if code is None:
            return
        self.returncode = code
        if code == 0:
            self.echo("runtimes: every runtime is installed")
        else:
            self.echo(f"runtimes: a build failed (exit code {code}); see {self.log_path}")
        self._close_log()

    def stop(self, timeout: float = 10.0) -> None:
        """Stop the builds (their whole process group: pip, cmake, the compilers)."""
        proc = self.proc
        if proc is not None and proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGTERM)
            try:
                proc.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
        if proc is not None:
            # What it started in its group and left running (a compiler past SIGTERM).
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
        self._close_log()

    def _close_log(self) -> None:
        if self._log is not None:
            self._log.close()
            self._log = None
