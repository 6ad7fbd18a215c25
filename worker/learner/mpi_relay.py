"""The MPI relay: how a sandboxed `mpirun` starts its daemons on the other learners.

On the local backend `mpirun` runs inside learner 1's sandbox (it is the tenant's own
process). To start `prted` on another learner it calls its ssh agent, which inside the
sandbox is `mpi_client.py` (standard library only, bound read-only, run with the
runtime's `python -I`): a process in bubblewrap's user namespace cannot enter another
learner's namespaces, so the client passes its standard input, output and error
(SCM_RIGHTS) with the host and the command to this relay, a thread of learner 1's
trusted wrapper, over a Unix socket of its training. The relay checks the host is a
learner of this training, runs `sh -c COMMAND` inside that learner's namespaces **and
sandbox** (the learner's own prefix, environment and resource limits, as its own command
would run) with the received descriptors, and answers the exit code.

The request is the tenant's input: one message of at most `MAX_REQUEST` bytes with
exactly three descriptors (no directory), a JSON object of a known host and a command of
at most `MAX_COMMAND` characters, sent within `REQUEST_TIMEOUT` seconds; at most
`MAX_ACTIVE` requests are served at once, the others refused. Nothing it asks for runs
outside a sandbox: the prefix comes from the backend, never from the request.
"""

from __future__ import annotations

import contextlib
import json
import os
import socket
import stat
import subprocess
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from service.domain.records import SpecError
from service.sandbox import limits
from service.sandbox.limits import Enforcement

MAX_REQUEST = 64 * 1024
MAX_COMMAND = 32 * 1024
# Requests served at once (a daemon per learner is what mpirun asks for), and how long
# a connection may take to send its request.
MAX_ACTIVE = 64
REQUEST_TIMEOUT = 10.0
SOCKET_NAME = "relay.sock"
# What the client gets when the relay refuses or fails (ssh's own failure code).
REFUSED = 255


class RelayRefused(ValueError):
    """A request the relay does not run; str() says why."""


@dataclass(frozen=True)
class RelayHost:
    """How one learner's processes start: its namespaces' and sandbox's prefix, its
    environment and its limits."""

    prefix: tuple[str, ...]
    env: dict[str, str]
    limits: Enforcement = field(default_factory=Enforcement)

    def to_dict(self) -> dict[str, Any]:
        return {"prefix": list(self.prefix), "env": self.env, "limits": self.limits.to_dict()}

    @classmethod
    def from_dict(cls, data: Any) -> RelayHost:
        if not isinstance(data, dict):
            raise SpecError("mpi_relay.hosts: an object per host is expected")
        prefix, env = data.get("prefix"), data.get("env")
        if not isinstance(prefix, list) or not all(isinstance(a, str) for a in prefix):
            raise SpecError("mpi_relay.hosts.prefix: a list of strings is expected")
        if not isinstance(env, dict) or not all(
            isinstance(k, str) and isinstance(v, str) for k, v in env.items()
        ):
            raise SpecError("mpi_relay.hosts.env: an object of strings is expected")
        return cls(tuple(prefix), dict(env), Enforcement.from_dict(data.get("limits", {})))


def parse_request(data: bytes, fds: list[int], hosts: dict[str, RelayHost]) -> tuple[str, str]:
    """(host, command) of a client's request; RelayRefused if it is not one to run."""
    if len(fds) != 3:
        raise RelayRefused(f"3 descriptors are expected, got {len(fds)}")
    try:
        request = json.loads(data)
    except (ValueError, RecursionError) as e:
        raise RelayRefused("the request is not JSON") from e
    if not isinstance(request, dict) or set(request) != {"host", "command"}:
        raise RelayRefused("the request is an object of host and command")
    host, command = request["host"], request["command"]
    if not isinstance(host, str) or host not in hosts:
        raise RelayRefused(f"{host!r} is not a learner of this training")
    if not isinstance(command, str) or not 0 < len(command) <= MAX_COMMAND or "\0" in command:
        raise RelayRefused(f"the command is a string of 1 to {MAX_COMMAND} characters")
    return host, command


def socket_address(dirfd: int) -> str:
    """The socket's path through a descriptor of its directory: short whatever the
    directory's length (a Unix socket's path has at most 107 bytes)."""
    return f"/proc/self/fd/{dirfd}/{SOCKET_NAME}"


class MpiRelay:
    """The relay of one training: serves `directory/relay.sock` while in `serving()`."""

    def __init__(
        self,
        directory: Path,
        hosts: dict[str, RelayHost],
        *,
        max_active: int = MAX_ACTIVE,
        request_timeout: float = REQUEST_TIMEOUT,
    ) -> None:
        self.directory = directory
        self.hosts = hosts
        self.request_timeout = request_timeout
        self._slots = threading.BoundedSemaphore(max_active)
        self._children: set[subprocess.Popen[bytes]] = set()
        self._lock = threading.Lock()
        self._stopping = threading.Event()

    @contextlib.contextmanager
    def serving(self) -> Iterator[None]:
        listener = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        dirfd = os.open(self.directory, os.O_PATH | os.O_DIRECTORY)
        try:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(SOCKET_NAME, dir_fd=dirfd)
            listener.bind(socket_address(dirfd))
            listener.listen(16)
        except OSError:
            listener.close()
            raise
        finally:
            os.close(dirfd)
        thread = threading.Thread(target=self._accept, args=(listener,), daemon=True)
        thread.start()
        try:
            yield
        finally:
            self._stopping.set()
            with contextlib.suppress(OSError):
                listener.shutdown(socket.SHUT_RDWR)
            listener.close()
            with self._lock:
                children = list(self._children)
            for child in children:
                with contextlib.suppress(OSError):
                    child.kill()
            thread.join(2)

    def _accept(self, listener: socket.socket) -> None:
        while not self._stopping.is_set():
            try:
                conn, _ = listener.accept()
            except OSError:
                return
            if not self._slots.acquire(blocking=False):
                with conn, contextlib.suppress(OSError):
                    conn.sendall(json.dumps({"exit": REFUSED}).encode())
                continue
            threading.Thread(target=self._serve, args=(conn,), daemon=True).start()

    def _serve(self, conn: socket.socket) -> None:
        try:
            self._answer(conn)
        finally:
            self._slots.release()

    def _answer(self, conn: socket.socket) -> None:
        fds: list[int] = []
        with conn:
            try:
                conn.settimeout(self.request_timeout)
                data, fds, flags, _ = socket.recv_fds(conn, MAX_REQUEST, 8)
                conn.settimeout(None)
                if flags & (socket.MSG_TRUNC | socket.MSG_CTRUNC):
                    raise RelayRefused(f"a request has at most {MAX_REQUEST} bytes")
                for fd in fds:
                    if stat.S_ISDIR(os.fstat(fd).st_mode):
                        raise RelayRefused("a descriptor is a directory")
                host, command = parse_request(data, fds, self.hosts)
                code = self._run(self.hosts[host], command, fds)
            except RelayRefused as e:
                code = REFUSED
                if len(fds) == 3:
                    with contextlib.suppress(OSError):
                        os.write(fds[2], f"mpi relay: {e}\n".encode())
            except OSError:
                code = REFUSED
            finally:
                for fd in fds:
                    with contextlib.suppress(OSError):
                        os.close(fd)
            with contextlib.suppress(OSError):
                conn.sendall(json.dumps({"exit": code}).encode())

    def _run(self, host: RelayHost, command: str, fds: list[int]) -> int:
        enforcement = host.limits
        limits.prepare(enforcement)
        child = subprocess.Popen(
            [*host.prefix, "/bin/sh", "-c", command],
            stdin=fds[0],
            stdout=fds[1],
            stderr=fds[2],
            env=host.env,
            cwd="/",
            close_fds=True,
            preexec_fn=None if enforcement == Enforcement() else lambda: limits.apply(enforcement),
        )
        with self._lock:
            self._children.add(child)
        for fd in fds:
            os.close(fd)
        fds.clear()
        try:
            code = child.wait()
            return code if code >= 0 else 128 - code  # killed by a signal: as a shell says
        finally:
            with self._lock:
                self._children.discard(child)
            limits.release(enforcement)
