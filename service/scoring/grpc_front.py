"""The scoring gRPC port served by `dlaas-grpc-front` (native/grpc_front/front.cc), the
transport outside Python: grpcio's own server spent about as much CPU on a call as a small
model's whole call in process (see the README's "Round seven"), before any of the
platform's work.

The front speaks HTTP/2 and gRPC with the callers and decides nothing. It holds no key
table or tenant state and parses no message: over one Unix socket it inherits (a
socketpair, no path on disk), it hands this process each call's method, peer and metadata;
this process checks the caller and its rate exactly as `grpc_gate.CallerGate` does for
grpcio, and only then says PROCEED, at which the front reads the call's message (refused
past DLAAS_MAX_PREDICTION_BYTES by the front's gRPC library, as grpcio's server does) and
sends its bytes. One exception saves that round trip on a busy connection: a call whose
connection's last call, with the same `authorization`, passed the check here (FINISH says
APPROVED) is read at once (CALL says READING); it is still checked here before its message
is used, and a call that fails the check makes the front forget the connection. A caller
that has never passed is never read before its check.

The method's own handler (`grpc_api.PredictionService.unary_methods`, the same as
grpcio's) parses and scores them on this event loop, and the call ends with the status,
trailing metadata and answer this process gives. A call the client cancels, or whose
deadline passes, is cancelled here too.

This module starts, restarts and stops the front's process; `front_protocol` is this
process's end of its socket (the frames and the calls).
"""

from __future__ import annotations

import asyncio
import logging
import os
import socket
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Protocol

from service import sandbox
from service.http.limits import CallerCheck
from service.scoring.front_protocol import FrontProtocol, stop_frame
from service.scoring.grpc_api import Method
from service.settings import Settings

log = logging.getLogger("dlaas.scoring")

BINARY = "dlaas-grpc-front"

_START_SECONDS = 30.0
RESTART_SECONDS = 1.0


def front_binary() -> Path | None:
    """The installed front: beside this Python's executable, where `make install` (and
    the image) put it; None where it is not built."""
    path = Path(sys.executable).parent / BINARY
    return path if os.access(path, os.X_OK) else None


def front_command(
    binary: Path,
    fd: int,
    address: str,
    max_receive: int,
    hidden: Sequence[str] = (),
    filter_fd: int | None = None,
) -> tuple[list[str], bool]:
    """The front's command line, and whether it runs in the sandbox. With `filter_fd`
    (the listening server's seccomp filter, `sandbox.listener_filter`, open on it) the
    front loads that filter once it listens: afterwards it opens no socket, connection or
    listener, so the network it keeps is only the port's.

    The front parses callers' bytes (HTTP/2, gRPC's framing) with a C++ library: it runs
    in the sandbox tenants' code runs in (service.sandbox: its own user, PID and IPC
    namespaces, no capabilities, `no_new_privs`, the seccomp filter), seeing the system's
    libraries and its own program read-only and nothing else of the machine (not
    DLAAS_HOME, not the platform's files; `hidden` where a system path would show them).
    It keeps the network (it listens on the platform's). Where no sandbox can be made it
    runs as it is, as grpcio's server would in this process."""
    program = [str(binary), "--fd", str(fd), "--listen", address]
    program += ["--max-receive", str(max_receive)]
    if filter_fd is not None:
        program += ["--seccomp", str(filter_fd)]
    support = sandbox.probe()
    if support.bwrap is None:
        return program, False
    policy = sandbox.SandboxPolicy(
        writable=(), readonly=(str(binary),), network=True, hidden=tuple(hidden), cwd="/"
    )
    return [*sandbox.argv(policy, support.bwrap), *program], True


def _open_listener_filter() -> int | None:
    """The listening server's filter, open for the front to read; None (and a warning)
    where it cannot be made."""
    try:
        return sandbox.open_listener_filter()
    except sandbox.SandboxUnavailable as e:
        log.warning("scoring: the gRPC front runs without its network filter: %s", e)
        return None
    except OSError as e:  # made, then taken away: not a front without it
        raise RuntimeError(f"the gRPC front's network filter cannot be read: {e}") from e


class Methods(Protocol):
    """What the front serves: `grpc_api.PredictionService`."""

    def unary_methods(self) -> dict[str, Method]: ...


class FrontServer:
    """The front's process and this process's end of its socket. A front that exits on
    its own (it should not) is logged and started again on the same port after
    RESTART_SECONDS, until `stop`."""

    def __init__(
        self,
        binary: Path,
        methods: dict[str, Method],
        callers: CallerCheck,
        host: str,
        hidden: Sequence[str] = (),
    ) -> None:
        self.binary = binary
        self.methods = methods
        self.callers = callers
        self.host = host
        self.hidden = tuple(hidden)
        self.sandboxed = False
        self.filtered = False
        self.max_receive = 0
        self.port = 0
        self.process: subprocess.Popen[bytes] | None = None
        self.protocol: FrontProtocol | None = None
        self._stopping = False
        self._watch: asyncio.Task[None] | None = None

    async def start(self, port: int, max_receive: int) -> int:
        """Start the front on `port` (0: one the system chooses); the port it listens on."""
        self.max_receive = max_receive
        address = f"{self.host}:{port}"
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        filter_fd = None
        try:
            filter_fd = _open_listener_filter()
            self.filtered = filter_fd is not None
            passed = (theirs.fileno(),) if filter_fd is None else (theirs.fileno(), filter_fd)
            command, self.sandboxed = front_command(
                self.binary, theirs.fileno(), address, max_receive, self.hidden, filter_fd
            )
            process = subprocess.Popen(
                command,
                pass_fds=passed,
                stdin=subprocess.DEVNULL,
                # Ctrl-C on `dlaas up` reaches its process group: the front is stopped by
                # `stop`, after the calls under way, not by the signal.
                start_new_session=True,
                cwd="/",
            )
        except BaseException:
            ours.close()
            raise
        finally:
            theirs.close()
            if filter_fd is not None:
                os.close(filter_fd)
        loop = asyncio.get_running_loop()
        try:
            _, protocol = await loop.create_unix_connection(
                lambda: FrontProtocol(self.methods, self.callers), sock=ours
            )
            self.port = await asyncio.wait_for(protocol.ready, _START_SECONDS)
        except BaseException as e:
            process.kill()
            await loop.run_in_executor(None, process.wait)
            ours.close()
            if isinstance(e, Exception):
                raise RuntimeError(
                    f"the scoring gRPC API cannot listen on {address} "
                    f"(DLAAS_SCORING_GRPC_HOST, DLAAS_SCORING_GRPC_PORT): {e or 'no answer'}"
                ) from e
            raise
        self.process, self.protocol = process, protocol
        self._watch = loop.create_task(self._restart_if_it_exits(process, protocol))
        log.info(
            "scoring: gRPC PredictionService and ModelService on %s:%s (%s, pid %s, %s, %s)",
            self.host,
            self.port,
            BINARY,
            process.pid,
            "in the sandbox" if self.sandboxed else "no sandbox can be made here",
            "no new sockets" if self.filtered else "without its network filter",
        )
        return self.port

    async def _restart_if_it_exits(
        self, process: subprocess.Popen[bytes], protocol: FrontProtocol
    ) -> None:
        # Shielded: cancelling this task must not cancel the future `stop` awaits too.
        await asyncio.shield(protocol.closed)
        if self._stopping:
            return
        code = await asyncio.get_running_loop().run_in_executor(None, process.wait)
        log.error(
            "scoring: the gRPC front exited (%s); starting it again in %s s",
            code,
            RESTART_SECONDS,
        )
        while not self._stopping:
            await asyncio.sleep(RESTART_SECONDS)
            if self._stopping:
                return
            try:
                await self.start(self.port, self.max_receive)
                return
            except RuntimeError:
                log.exception("scoring: the gRPC front did not start again")

    async def stop(self, grace: float | None) -> None:
        """Refuse new calls at once; calls under way get `grace` seconds to end (then are
        cancelled); the front exits."""
        self._stopping = True
        if self._watch is not None:
            self._watch.cancel()
            # A front being started again is killed by the cancellation, or is the one
            # stopped below once its start has ended: none outlives `stop`.
            await asyncio.wait([self._watch])
        process, protocol = self.process, self.protocol
        if process is None or protocol is None:
            return
        loop = asyncio.get_running_loop()
        protocol.send(stop_frame(grace))
        try:
            await asyncio.wait_for(
                loop.run_in_executor(None, process.wait), timeout=(grace or 0) + 5
            )
        except TimeoutError:
            log.error("scoring: the gRPC front did not stop; killing it")
            process.kill()
            await loop.run_in_executor(None, process.wait)
        if protocol.transport is not None:
            protocol.transport.close()
        await protocol.closed


async def start_front(
    binary: Path, service: Methods, settings: Settings, callers: CallerCheck
) -> tuple[FrontServer, int]:
    """Start the front on DLAAS_SCORING_GRPC_HOST:DLAAS_SCORING_GRPC_PORT, its calls
    served on this event loop; the port it listens on."""
    assert settings.scoring_grpc_port is not None
    server = FrontServer(
        binary,
        service.unary_methods(),
        callers,
        settings.scoring_grpc_host,
        hidden=(str(settings.home_dir),),
    )
    port = await server.start(settings.scoring_grpc_port, settings.max_prediction_bytes)
    return server, port
