"""`dlaas tensorboard`: a training's LOG_DIR files, every learner's, mirrored into a local
directory through the public REST API (the results: `learner-<i>/logs/...`, which learners
sync while they run), and TensorBoard run on it.

Each learner's files land under `learner-<i>/`, so TensorBoard names its runs after the
learners (`learner-1`, `learner-1/train`, ...). A file that grew since the last sync is
written in place, an event file that grew by appending its new bytes (a Range request):
TensorBoard keeps its event files open and reads on from where it was, so a file is never
replaced under it.
"""

from __future__ import annotations

import contextlib
import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path, PurePosixPath

import httpx

from dlaas.client import Client
from dlaas.errors import DlaasError
from dlaas.models import ResultFile

# learner-<i>/logs/<path below LOG_DIR> among a training's results
_LOG_DIR_FILE = re.compile(r"^learner-(?P<learner>[1-9][0-9]*)/logs/(?P<path>.+)$")


@dataclass
class _Copy:
    size: int
    last_modified: str


class LogDirMirror:
    """Keeps `root` a copy of a training's LOG_DIR files, as they are stored now."""

    def __init__(self, client: Client, training_id: str, root: Path) -> None:
        self.client = client
        self.training_id = training_id
        self.root = root
        self._copies: dict[str, _Copy] = {}

    def sync(self) -> int:
        """Fetch what is new or changed since the last sync; the files written."""
        written = 0
        for remote in self.client.trainings.results(self.training_id):
            local = self.local_path(remote.path)
            if local is None or remote.size is None:
                continue
            stamp = remote.last_modified.isoformat() if remote.last_modified else ""
            copy = self._copies.get(remote.path)
            if copy is not None and (copy.size, copy.last_modified) == (remote.size, stamp):
                continue
            self._fetch(remote, local, copy)
            self._copies[remote.path] = _Copy(remote.size, stamp)
            written += 1
        return written

    def local_path(self, result_path: str) -> Path | None:
        """Where a result is mirrored: learner-<i>/<path below LOG_DIR>; None for a result
        that is not a LOG_DIR file, or whose path would leave the directory."""
        match = _LOG_DIR_FILE.match(result_path)
        if match is None:
            return None
        relative = PurePosixPath(f"learner-{match['learner']}", match["path"])
        if relative.is_absolute() or any(part in ("", ".", "..") for part in relative.parts):
            return None
        return self.root.joinpath(*relative.parts)

    def _fetch(self, remote: ResultFile, local: Path, copy: _Copy | None) -> None:
        local.parent.mkdir(parents=True, exist_ok=True)
        size = remote.size or 0
        have = local.stat().st_size if copy is not None and local.is_file() else 0
        if copy is not None and 0 < have < size and "tfevents" in local.name:
            # A grown event file (they are only ever appended to): its new bytes.
            with local.open("r+b") as out:
                out.seek(have)
                self.client.trainings.result(self.training_id, remote.path, out, offset=have)
            return
        # New, or rewritten: in place all the same (the same file for a reader that has it).
        with local.open("wb") as out:
            self.client.trainings.result(self.training_id, remote.path, out)


def tensorboard_executable() -> Path:
    """TensorBoard's command from this environment (the one `dlaas` runs in)."""
    return Path(sys.executable).with_name("tensorboard")


def start_tensorboard(
    logdir: Path, port: int, *, host: str = "127.0.0.1", executable: Path | None = None
) -> subprocess.Popen[bytes]:
    """TensorBoard serving `logdir` on host:port, re-reading it every few seconds; raises
    DlaasError if it is not installed here.

    It leads a process group of its own, with the data server it starts
    (`tensorboard_data_server`): `stop_tensorboard` stops the group, and a Ctrl-C at the
    terminal reaches `dlaas tensorboard` alone, which stops it."""
    executable = executable or tensorboard_executable()
    if not executable.is_file():
        raise DlaasError(
            f"dlaas tensorboard needs TensorBoard in the environment dlaas runs in "
            f"({executable} is missing): pip install 'tensorboard>=2.18'"
        )
    return subprocess.Popen(
        [
            str(executable),
            "--logdir",
            str(logdir),
            "--host",
            host,
            "--port",
            str(port),
            "--reload_interval",
            "2",
        ],
        process_group=0,
    )


def wait_until_serving(proc: subprocess.Popen[bytes], url: str, timeout: float = 120) -> None:
    """Return once TensorBoard answers at `url`; DlaasError if it exits or does not answer
    within `timeout` seconds."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if (code := proc.poll()) is not None:
            raise DlaasError(f"TensorBoard exited with code {code} before it served {url}")
        try:
            if httpx.get(f"{url}data/environment", timeout=2).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.2)
    raise DlaasError(f"TensorBoard did not answer at {url} within {timeout:g} s")


def stop_tensorboard(proc: subprocess.Popen[bytes], grace: float = 5) -> None:
    """Stop TensorBoard's process group: SIGTERM, SIGKILL after `grace` seconds, and
    SIGKILL to whatever of the group outlives TensorBoard (its data server)."""
    if proc.returncode is None:  # not reaped: its pid is its group's id still
        _signal_group(proc.pid, signal.SIGTERM)
        deadline = time.monotonic() + grace
        while not _exited(proc) and time.monotonic() < deadline:
            time.sleep(0.05)
        _signal_group(proc.pid, signal.SIGKILL)
    proc.wait()


def _exited(proc: subprocess.Popen[bytes]) -> bool:
    """Whether it has exited, without reaping it (an unreaped leader keeps its process
    group's id from being reused, so the group can be killed safely after it exits)."""
    try:
        return os.waitid(os.P_PID, proc.pid, os.WEXITED | os.WNOHANG | os.WNOWAIT) is not None
    except ChildProcessError:
        return True


def _signal_group(pgid: int, sig: signal.Signals) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, sig)


@contextlib.contextmanager
def interruptible() -> Iterator[None]:
    """Ctrl-C (SIGINT) and SIGTERM raise KeyboardInterrupt inside, whatever this process
    inherited: a command started from a script in the background inherits SIGINT ignored,
    and a `kill` would otherwise end it without stopping what it started."""
    previous = {sig: signal.getsignal(sig) for sig in (signal.SIGINT, signal.SIGTERM)}
    for sig in previous:
        signal.signal(sig, signal.default_int_handler)
    try:
        yield
    finally:
        for sig, handler in previous.items():
            if handler is not None:
                signal.signal(sig, handler)
