"""Runtimes installed on their first use (DLAAS_RUNTIME_AUTO_INSTALL), in the background.

A launch whose runtime is not installed starts its install in a thread of the worker's
process (one per runtime; a launch that finds one running joins its waiters) and returns
at once: the worker goes on launching other trainings while the runtime builds (Horovod
compiles for minutes). The training waits in PENDING with the install's progress in its
status_message; when the install ends, a LAUNCH is sent again for every training that
waited for it, and their learners start in the runtime just built. A build that fails
fails them, naming the runtime and the command that shows the whole build.

Nothing here needs to survive the process: a worker killed mid-install leaves its trainings
PENDING with no learners, the monitor sends their LAUNCH again (worker.monitor's
LAUNCH_RETRY), and that launch starts the install again (the half-built runtime is not
taken: service.runtimes installs under a lock and a marker written last).
"""

from __future__ import annotations

import logging
import threading
import time
from dataclasses import dataclass, field

from service import runtimes
from service.db import repository
from service.dispatch import LAUNCH
from service.domain.reports import clean_text
from service.domain.runtimes import install_command
from service.domain.states import TrainingState
from service.platform import Platform
from service.trainings import record_transition

log = logging.getLogger("dlaas.worker")


class _InstallProgress:
    """Shows a runtime install's progress in a PENDING training's status_message: at most
    one write every `every` seconds, and only while the training still waits for it."""

    def __init__(
        self, platform: Platform, training_id: str, runtime: str, every: float = 2.0
    ) -> None:
        self.platform, self.training_id, self.runtime = platform, training_id, runtime
        self.every = every
        self.started = time.monotonic()
        self.written = 0.0

    def prefix(self) -> str:
        return f"installing the runtime '{self.runtime}' on its first use"

    def __call__(self, line: str) -> None:
        now = time.monotonic()
        if now - self.written < self.every:
            return
        self.written = now
        elapsed = int(now - self.started)
        self.write(f"{self.prefix()} ({elapsed // 60}m{elapsed % 60:02d}s): {line.strip()}")

    def write(self, message: str, unless_prefix: str | None = None) -> None:
        write_pending_message(self.platform, self.training_id, message, unless_prefix)


def write_pending_message(
    platform: Platform, training_id: str, message: str, unless_prefix: str | None = None
) -> None:
    """Set the status_message of the training while it is PENDING (unless it already
    starts with `unless_prefix`)."""
    with platform.sessions() as session:
        training = repository.training_by_id(session, training_id)
        if training is None or training.status != TrainingState.PENDING:
            return
        if unless_prefix and (training.status_message or "").startswith(unless_prefix):
            return
        training.status_message = clean_text(message)[:1000]
        session.commit()


def waiting_message(name: str) -> str:
    return f"waiting for the runtime '{name}', being installed on its first use"


@dataclass
class _Install:
    name: str
    first: str
    waiters: list[str] = field(default_factory=list)
    done: threading.Event = field(default_factory=threading.Event)


class RuntimeInstalls:
    """The runtime installs running in this process, by runtime name."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._running: dict[str, _Install] = {}

    def request(self, platform: Platform, name: str, training_id: str) -> None:
        """Have the runtime `name` installed for the training (PENDING): in a new thread,
        or by the install of it already running here, whose waiters it joins."""
        with self._lock:
            install = self._running.get(name)
            if install is None:
                install = self._running[name] = _Install(name, training_id, [training_id])
                thread = threading.Thread(
                    target=self._run,
                    args=(platform, install),
                    name=f"dlaas-install-{name}",
                    daemon=True,
                )
                thread.start()
                return
            if training_id not in install.waiters:
                install.waiters.append(training_id)
            first = install.first
        if training_id != first:
            write_pending_message(
                platform,
                training_id,
                waiting_message(name),
                unless_prefix=f"installing the runtime '{name}'",
            )

    def running(self) -> list[str]:
        with self._lock:
            return sorted(self._running)

    def wait(self, name: str, timeout: float | None = None) -> bool:
        """Wait for the install of `name` running here, if any, to end; False on timeout."""
        with self._lock:
            install = self._running.get(name)
        return install is None or install.done.wait(timeout)

    def _run(self, platform: Platform, install: _Install) -> None:
        name = install.name
        progress = _InstallProgress(platform, install.first, name)
        try:
            try:
                platform.install_runtime(name, progress, wait=False)
            except runtimes.InstallInProgress:
                # Another process (another worker, `dlaas runtimes install`) builds it:
                # wait for its turn here, not in a launch.
                for training_id in self._waiters(install):
                    write_pending_message(platform, training_id, waiting_message(name))
                platform.install_runtime(name, progress, wait=True)
        except runtimes.RuntimeBuildError as e:
            self._failed(platform, install, e)
            self._finish(install)
            return
        except Exception:
            # Not the build's fault (the database, the disk): the monitor sends the
            # trainings' LAUNCH again, which tries again.
            log.exception("installing the runtime %s failed", name)
            self._finish(install)
            return
        progress.every = 0.0
        progress(f"installed in {time.monotonic() - progress.started:.0f}s; starting the learners")
        for training_id in self._finish(install):
            try:
                platform.dispatcher.send(LAUNCH, training_id)
            except Exception:  # the broker is down: the monitor sends it again
                log.exception("could not send %s for %s", LAUNCH, training_id)

    def _waiters(self, install: _Install) -> list[str]:
        with self._lock:
            return list(install.waiters)

    def _finish(self, install: _Install) -> list[str]:
        """No longer running: the trainings that waited for it."""
        with self._lock:
            self._running.pop(install.name, None)
            waiters = list(install.waiters)
        install.done.set()
        return waiters

    def _failed(
        self, platform: Platform, install: _Install, error: runtimes.RuntimeBuildError
    ) -> None:
        name = install.name
        last = str(error).strip().splitlines()[-1] if str(error).strip() else "no output"
        log.error("installing the runtime %s failed: %s", name, error)
        for training_id in self._waiters(install):
            with platform.sessions() as session:
                training = repository.training_by_id(session, training_id)
                if training is None or training.status != TrainingState.PENDING:
                    continue
                record_transition(
                    training,
                    TrainingState.FAILED,
                    f"the learners could not be started: the runtime '{name}' could not be "
                    f"installed ({last}); its operator can run `{install_command(name)}` to "
                    "see the whole build",
                )
                session.commit()


# This worker process's installs.
INSTALLS = RuntimeInstalls()


def runtime_ready(platform: Platform, training_id: str) -> bool:
    """Whether the training's launch may go on now: its runtime is installed (or is the
    platform's, or the operator installs runtimes). Where it is not and the operator lets
    the platform install it on first use (DLAAS_RUNTIME_AUTO_INSTALL), its install is
    started (or joined) in the background and the training waits in PENDING: False."""
    with platform.sessions() as session:
        training = repository.training_by_id(session, training_id)
        if training is None or training.status != TrainingState.PENDING:
            return True  # launch() decides
        name = platform.catalog.runtime(training.framework_name, training.framework_version)
    if (
        name == runtimes.PLATFORM
        or not platform.settings.runtime_auto_install
        or platform.runtime(name) is not None
    ):
        return True
    INSTALLS.request(platform, name, training_id)
    return False
