"""Status reporting: how the trusted part of a learner tells the platform its phase.

Only the learner wrapper reports; the user's command never can. The local backend's
channel is a JSON file in the learner's private directory, which the sandbox does not
show to the command, plus a datagram that wakes the monitor; a backend supplies its own
`StatusReporter`. The platform still treats every report as untrusted input.
"""

from __future__ import annotations

import json
import os
import socket
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

from service.domain.states import TrainingState


@dataclass(frozen=True)
class Status:
    phase: TrainingState
    exit_code: int | None = None
    message: str | None = None
    # The running command's pid, which is also its process group id: a backend can still
    # stop the command with it if the wrapper dies.
    child_pid: int | None = None
    # When each phase began, so a monitor that polls still records the phases it missed.
    phases: dict[str, float] = field(default_factory=dict)


class StatusReporter(Protocol):
    def report(self, status: Status) -> None: ...


def notify(socket_path: str | None, training_id: str) -> None:
    """Tell the backend's monitor that a status changed, so it need not poll fast to see
    it. Best effort: when nobody listens, the monitor's polling still finds it."""
    if not socket_path:
        return
    try:
        with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as sock:
            sock.setblocking(False)
            sock.sendto(training_id.encode(), socket_path)
    except OSError:
        pass


def write_status(path: Path, status: Status) -> None:
    """Replace the status file atomically with the status, this process's pid and the time."""
    data = {
        "phase": status.phase.value,
        "pid": os.getpid(),
        "child_pid": status.child_pid,
        "exit_code": status.exit_code,
        "message": status.message,
        "updated_at": time.time(),
        "phases": status.phases,
    }
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".status-")
    try:
        os.fchmod(fd, 0o600)
        with os.fdopen(fd, "w") as f:
            json.dump(data, f)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


@dataclass(frozen=True)
class FileStatusReporter:
    """The local backend's channel: a status file, then a wake-up datagram."""

    path: Path
    training_id: str
    notify_socket: str | None = None

    def report(self, status: Status) -> None:
        write_status(self.path, status)
        notify(self.notify_socket, self.training_id)
