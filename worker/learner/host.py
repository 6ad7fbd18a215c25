"""What a backend supplies to the learner wrapper besides the spec: the local mechanisms.

The learner spec is the contract every backend shares (what to fetch, run and store).
How the wrapper reports its status, meets the other learners and enters the place the
command runs in belong to the backend. `LocalHost` is the local backend's, a JSON file
next to the spec: a status file and a wake-up socket, rendezvous files, the command's
prefix (the learner's namespaces, then its sandbox) and the resource limits to apply.
It holds no credentials.
"""

from __future__ import annotations

import json
import os
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar, Protocol

from service.domain.records import OPT_STR, STR, SpecError, checked_fields
from service.sandbox.limits import Enforcement
from worker.learner.mpi_relay import MpiRelay, RelayHost
from worker.learner.status import FileStatusReporter, StatusReporter

_POLL_SECONDS = 0.05


class Rendezvous(Protocol):
    @property
    def timeout(self) -> float:
        """How long wait() waits, in seconds."""
        ...

    def ready(self) -> None:
        """Tell the others this learner's code and data are in place."""
        ...

    def wait(self) -> list[str]:
        """Wait for the others (when asked to); returns who is still missing at the
        deadline (empty: everyone is ready). Interrupted by the wrapper's stop signal."""
        ...


@dataclass(frozen=True)
class FileRendezvous:
    ready_file: str | None
    wait_for: tuple[str, ...]
    timeout: float

    def ready(self) -> None:
        if self.ready_file:
            Path(self.ready_file).parent.mkdir(parents=True, exist_ok=True)
            Path(self.ready_file).touch()

    def wait(self) -> list[str]:
        deadline = time.monotonic() + self.timeout
        while missing := [p for p in self.wait_for if not os.path.exists(p)]:
            if time.monotonic() >= deadline:
                return missing
            time.sleep(_POLL_SECONDS)
        return []


@dataclass(frozen=True)
class LocalHost:
    # The learner's private directory (status, training-log.txt): never in the sandbox.
    private_dir: str
    status_file: str
    notify_socket: str | None = None
    # Prefixed to the spec's command: enter the learner's namespaces, then its sandbox.
    run_prefix: list[str] = field(default_factory=list)
    ready_file: str | None = None
    wait_for: list[str] = field(default_factory=list)
    wait_timeout: float = 600.0
    limits: Enforcement = field(default_factory=Enforcement)
    # MPI launcher only: the relay that starts daemons in the other learners' sandboxes
    # (worker.learner.mpi_relay): {"directory": its socket's, "hosts": {host: RelayHost}}.
    mpi_relay: dict[str, Any] | None = None

    _TYPES: ClassVar[dict[str, tuple[type, ...]]] = {
        "private_dir": STR,
        "status_file": STR,
        "notify_socket": OPT_STR,
        "run_prefix": (list,),
        "ready_file": OPT_STR,
        "wait_for": (list,),
        "wait_timeout": (int, float),
        "limits": (dict,),
        "mpi_relay": (dict, type(None)),
    }

    @classmethod
    def from_dict(cls, data: Any) -> LocalHost:
        values = checked_fields(cls, data, "host")
        for name in ("run_prefix", "wait_for"):
            if not all(isinstance(a, str) for a in values.get(name, [])):
                raise SpecError(f"host.{name}: a list of strings is expected")
        values["limits"] = Enforcement.from_dict(values.get("limits", {}))
        return cls(**values)

    def to_dict(self) -> dict[str, Any]:
        return {
            "private_dir": self.private_dir,
            "status_file": self.status_file,
            "notify_socket": self.notify_socket,
            "run_prefix": self.run_prefix,
            "ready_file": self.ready_file,
            "wait_for": self.wait_for,
            "wait_timeout": self.wait_timeout,
            "limits": self.limits.to_dict(),
            "mpi_relay": self.mpi_relay,
        }

    def write(self, path: Path) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w") as f:
            json.dump(self.to_dict(), f)

    @classmethod
    def read(cls, path: Path) -> LocalHost:
        return cls.from_dict(json.loads(path.read_text()))

    def reporter(self, training_id: str) -> StatusReporter:
        return FileStatusReporter(Path(self.status_file), training_id, self.notify_socket)

    def relay(self) -> MpiRelay | None:
        """The MPI relay this learner serves, if any; SpecError if malformed."""
        if self.mpi_relay is None:
            return None
        directory, hosts = self.mpi_relay.get("directory"), self.mpi_relay.get("hosts")
        if not isinstance(directory, str) or not isinstance(hosts, dict):
            raise SpecError("host.mpi_relay: an object of directory and hosts is expected")
        return MpiRelay(Path(directory), {h: RelayHost.from_dict(v) for h, v in hosts.items()})

    def rendezvous(self) -> Rendezvous:
        return FileRendezvous(self.ready_file, tuple(self.wait_for), self.wait_timeout)
