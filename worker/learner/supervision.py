"""Process supervision: the user's command as one process group, stopped as a whole.

SIGTERM is forwarded to the command's group and followed by SIGKILL after the grace
period; whatever the command left running in its group is killed once it exits (as a
container's end would). In a sandbox the group's first process is bubblewrap, whose
PID namespace takes every process of the command with it.

The grace period is the command's own: the processes of a prefix the command runs
through (the learner network's `nsenter`, the sandbox's launcher and `bwrap`) ignore
SIGTERM, and `env --default-signal=TERM` gives it back its default just before the
command. Were bubblewrap to take the group's SIGTERM, it would die of it at once and
its PID namespace would SIGKILL the command, whose handler (a last checkpoint) never ran.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import threading
import time
from collections.abc import Callable, Sequence

_POLL_SECONDS = 0.05
# Between a prefix and the command: SIGTERM at its default again, whatever the prefix's
# processes ignore (coreutils' env, by its path: the system every sandbox sees holds it,
# and no PATH the command's environment names is searched for it).
_DEFAULT_TERM = ("/usr/bin/env", "--default-signal=TERM", "--")


def killpg(pgid: int, sig: signal.Signals) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, sig)


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


class Supervisor:
    """Starts one command and sees it to its end, honouring a stop request."""

    def __init__(self, grace_seconds: float) -> None:
        self.grace = grace_seconds
        self.stop_requested = False
        self.child: subprocess.Popen[bytes] | None = None
        self.term_sent_at: float | None = None
        self.kill_sent = False
        self.through_prefix = False

    def start(
        self,
        argv: list[str],
        *,
        cwd: str,
        env: dict[str, str],
        before_exec: Callable[[], None] | None = None,
        prefix: Sequence[str] = (),
    ) -> subprocess.Popen[bytes]:
        """The command (`argv`, run through `prefix`: a sandbox, a network to enter) with
        its output on a pipe, in a process group of its own; SIGTERM to the group reaches
        the command alone (see the module's docstring)."""
        full = [*prefix, *_DEFAULT_TERM, *argv] if prefix else list(argv)
        self.through_prefix = bool(prefix)

        def child_setup() -> None:
            if prefix:  # inherited through every exec of the prefix, undone by env
                signal.signal(signal.SIGTERM, signal.SIG_IGN)
            if before_exec is not None:
                before_exec()

        self.child = subprocess.Popen(
            full,
            cwd=cwd,
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            start_new_session=True,  # its own process group, signalled as a whole
            # The wrapper has no other thread yet.
            preexec_fn=child_setup if prefix or before_exec is not None else None,
        )
        return self.child

    def request_stop(self) -> None:
        self.stop_requested = True
        self.forward_term()

    def forward_term(self) -> None:
        if self.child is not None and self.term_sent_at is None:
            self.term_sent_at = time.monotonic()
            killpg(self.child.pid, signal.SIGTERM)

    def supervise(self) -> tuple[int, bool]:
        """Wait for the command; on a stop, TERM its group and KILL it after the grace.

        Returns the return code and whether the command was stopped.
        """
        proc = self.child
        assert proc is not None
        exited = threading.Event()

        def wait_without_reaping() -> None:
            # An unreaped leader keeps its process group id from being reused, so the group
            # can be killed safely after it exits.
            with contextlib.suppress(ChildProcessError):
                os.waitid(os.P_PID, proc.pid, os.WEXITED | os.WNOWAIT)
            exited.set()

        threading.Thread(target=wait_without_reaping, name="child-wait", daemon=True).start()
        while not exited.wait(_POLL_SECONDS):
            if self.stop_requested:
                self.forward_term()
                sent = self.term_sent_at
                late = sent is not None and time.monotonic() >= sent + self.grace
                if late and not self.kill_sent:
                    self.kill_sent = True
                    killpg(proc.pid, signal.SIGKILL)
        halted = self.stop_requested
        killpg(proc.pid, signal.SIGKILL)
        self.child = None
        code = proc.wait()
        if halted and self.through_prefix and code == 128 + signal.SIGTERM:
            # A sandbox reports its command's death by a signal as 128 + the signal
            # (bubblewrap does); a stopped command is reported as without one.
            code = -signal.SIGTERM
        return code, halted

    def kill(self, proc: subprocess.Popen[bytes]) -> None:
        """Leave nothing running (supervision itself failed)."""
        killpg(proc.pid, signal.SIGKILL)
        proc.wait()
        self.child = None
