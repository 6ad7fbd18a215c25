"""The suite leaves the machine as it found it: a pytest plugin (loaded by tests/conftest.py)
that fails the run naming every process the tests started that is still alive at its end.

At the start of the session a marker, `PYTEST_DLAAS_SESSION=<uuid>`, is put in this
process's environment, so every process the tests start inherits it, and so do the
processes those start (the platform's processes and the learner wrappers drop the
platform's `DLAAS_*` settings from their environment, not this). A learner's own command
starts from its spec's environment without it, in a sandbox that dies with its wrapper;
the processes whose command line or working directory lies in the session's temporary
directory are counted as well. Learner network holders and their sleepers (the processes
that keep a training's network namespaces, `worker.backends.netns`; the platform names no
namespace, so `ip netns` lists none of them) carry the marker too: a network namespace the
tests made and left is found, and named, as its holder.

After each test the processes with the marker that were not there before are noted
against that test, so that a leftover is named with the test that left it. At the end
of the session, after a short grace for processes that are ending, whatever remains
fails the run (exit status 1), is listed, and is then killed (by process, SIGKILL).
"""

from __future__ import annotations

import contextlib
import os
import signal
import sys
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

MARK = "PYTEST_DLAAS_SESSION"
NETWORK_MARK = "DLAAS_LEARNER_NETWORK"
GRACE_SECONDS = float(os.environ.get("PYTEST_DLAAS_LEFTOVER_GRACE", "10"))


@dataclass(frozen=True)
class Leftover:
    pid: int
    ppid: int
    command: str
    network: str | None  # the learner network's state directory, for a network holder

    def describe(self) -> str:
        what = f"pid {self.pid} (parent {self.ppid}): {self.command}"
        if self.network is not None:
            what += f"  [learner network namespace of {self.network}]"
        return what


def _read(pid: int, name: str) -> bytes | None:
    try:
        return Path(f"/proc/{pid}/{name}").read_bytes()
    except OSError:
        return None


def _stat(pid: int) -> tuple[str, int] | None:
    """(state, parent pid) of a process; None if it is gone."""
    raw = _read(pid, "stat")
    if raw is None:
        return None
    fields = raw.decode(errors="replace").rsplit(")", 1)[1].split()
    return fields[0], int(fields[1])


def _ancestors() -> set[int]:
    """This process and the processes above it (never leftovers)."""
    found, pid = set(), os.getpid()
    while pid > 1 and pid not in found:
        found.add(pid)
        stat = _stat(pid)
        if stat is None:
            break
        pid = stat[1]
    return found


_TRACKER = b"from multiprocessing.resource_tracker import main"


def find(session: str, tmp_root: Path | None = None) -> list[Leftover]:
    """Live processes (no zombies) of this test session: those whose environment carries
    `MARK=session`, or whose command line or working directory lies in `tmp_root`."""
    marker = f"{MARK}={session}".encode()
    root = os.fsencode(str(tmp_root)) + b"/" if tmp_root is not None else None
    skip = _ancestors()
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or int(entry) in skip:
            continue
        pid = int(entry)
        environ = _read(pid, "environ")
        if environ is None or (root is None and marker not in environ):
            continue  # (the cheap test first: this runs after every test)
        cmdline = _read(pid, "cmdline")
        stat = _stat(pid)
        if cmdline is None or stat is None or stat[0] in ("Z", "X"):
            continue
        if stat[1] == os.getpid() and _TRACKER in cmdline:
            # multiprocessing's resource tracker, started by this process (a test that used
            # a multiprocessing primitive): it reads a pipe from this process and exits when
            # this process does, so it is no leftover.
            continue
        variables = environ.split(b"\0")
        ours = marker in variables
        if not ours and root is not None:
            with contextlib.suppress(OSError):
                cwd = os.fsencode(os.readlink(f"/proc/{pid}/cwd")) + b"/"
                ours = cwd.startswith(root)
            ours = ours or root in cmdline.replace(b"\0", b" ") + b"/"
        if not ours:
            continue
        network = next(
            (
                v.split(b"=", 1)[1].decode(errors="replace")
                for v in variables
                if v.startswith(f"{NETWORK_MARK}=".encode())
            ),
            None,
        )
        command = cmdline.replace(b"\0", b" ").decode(errors="replace").strip()
        found.append(Leftover(pid, stat[1], command[:300], network))
    return sorted(found, key=lambda p: p.pid)


def _wait_gone(session: str, tmp_root: Path | None, grace: float) -> list[Leftover]:
    deadline = time.monotonic() + grace
    while (left := find(session, tmp_root)) and time.monotonic() < deadline:
        time.sleep(0.2)
    return left


class LeftoverCheck:
    """The plugin's state: the session's marker, and which test each process outlived."""

    def __init__(self) -> None:
        self.session = uuid.uuid4().hex
        self.tmp_root: Path | None = None
        self.seen: dict[int, str] = {}  # pid -> the test after which it was first seen

    def note(self, nodeid: str) -> None:
        for proc in find(self.session):
            self.seen.setdefault(proc.pid, nodeid)

    def report(self, left: list[Leftover]) -> list[str]:
        lines = [
            f"{len(left)} process(es) the tests started are still running "
            "(the suite must leave nothing behind):"
        ]
        for proc in left:
            after = self.seen.get(proc.pid)
            lines.append(f"  {proc.describe()}" + (f"  -- left by {after}" if after else ""))
        return lines


_check = LeftoverCheck()


def pytest_configure(config: pytest.Config) -> None:
    os.environ[MARK] = _check.session


@pytest.fixture(autouse=True)
def _leftovers_noted(request: pytest.FixtureRequest) -> Iterator[None]:
    yield
    _check.note(request.node.nodeid)


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    check(session)


def check(session: pytest.Session) -> None:
    """Fail the session (exit status 1) naming what its tests left running, then kill it."""
    with contextlib.suppress(Exception):
        factory = session.config._tmp_path_factory  # type: ignore[attr-defined]
        _check.tmp_root = factory.getbasetemp().resolve()
    left = _wait_gone(_check.session, _check.tmp_root, GRACE_SECONDS)
    if not left:
        return
    lines = _check.report(left)
    reporter = session.config.pluginmanager.get_plugin("terminalreporter")
    if reporter is not None:
        reporter.write_sep("=", "processes left behind", red=True)
        for line in lines:
            reporter.write_line(line)
    else:
        print("\n".join(lines), file=sys.stderr)
    # Named; now gone, so a failed run leaves the machine clean all the same.
    for proc in left:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(proc.pid, signal.SIGKILL)
    session.exitstatus = pytest.ExitCode.TESTS_FAILED
