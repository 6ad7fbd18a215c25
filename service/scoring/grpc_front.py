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

Frames, both ways: u32 length (of what follows), u8 type, u64 call id, payload (the
integers little-endian; a string is a u32 length and its bytes); front.cc's header lists
them. Writes are gathered and sent once per turn of the event loop.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import socket
import struct
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Protocol

import grpc
from grpc import aio

from service import sandbox
from service.errors import BadRequest
from service.http.limits import CallerCheck
from service.scoring.grpc_api import Method, refuse
from service.scoring.grpc_gate import SENT_NO_MESSAGE, check_caller
from service.settings import Settings

log = logging.getLogger("dlaas.scoring")

BINARY = "dlaas-grpc-front"

READY, FAILED, CALL, MESSAGE, NO_MESSAGE, CANCELLED = 1, 2, 3, 4, 5, 6
PROCEED, FINISH, STOP = 10, 11, 12
READING = 1  # CALL's flag: the front reads the message already
APPROVED = 1  # FINISH's flag: the call passed the caller's check

_HEAD = struct.Struct("<IBQ")  # length, type, call id
_U32 = struct.Struct("<I")
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


def _frame(kind: int, call: int, payload: bytes = b"") -> bytes:
    return _HEAD.pack(9 + len(payload), kind, call) + payload


def _string(data: bytes) -> bytes:
    return _U32.pack(len(data)) + data


class _Reader:
    """The payload of one frame, read in order."""

    def __init__(self, data: bytes) -> None:
        self.data = data
        self.at = 0

    def u32(self) -> int:
        (value,) = _U32.unpack_from(self.data, self.at)
        self.at += 4
        return int(value)

    def string(self) -> bytes:
        n = self.u32()
        value = self.data[self.at : self.at + n]
        if len(value) != n:
            raise ValueError("a string past the frame's end")
        self.at += n
        return value


def _metadata_value(key: str, value: bytes) -> str | bytes:
    # As grpcio hands them over: binary headers as bytes, the others as text.
    return value if key.endswith("-bin") else value.decode("latin-1")


class FrontContext:
    """The part of grpc.aio's ServicerContext the handlers use, for one call of the
    front: its metadata and peer, the trailing metadata, and `abort`, which records the
    status and raises grpc.aio's AbortError as grpcio's does."""

    def __init__(self, metadata: tuple[tuple[str, str | bytes], ...], peer: str) -> None:
        self._metadata = metadata
        self._peer = peer
        self.trailing: tuple[tuple[str, str], ...] = ()
        self.code = grpc.StatusCode.OK
        self.details = ""

    def invocation_metadata(self) -> tuple[tuple[str, str | bytes], ...]:
        return self._metadata

    def peer(self) -> str:
        return self._peer

    def set_trailing_metadata(self, metadata: Sequence[tuple[str, str]]) -> None:
        self.trailing = tuple(metadata)

    async def abort(
        self,
        code: grpc.StatusCode,
        details: str = "",
        trailing_metadata: Sequence[tuple[str, str]] = (),
    ) -> None:
        if code == grpc.StatusCode.OK:
            raise ValueError("abort with the OK status")
        self.code = code
        self.details = details
        if trailing_metadata:
            self.trailing = tuple(trailing_metadata)
        raise aio.AbortError()


class _Call:
    __slots__ = ("message", "task")

    def __init__(self) -> None:
        self.message: asyncio.Future[bytes | None] | None = None
        self.task: asyncio.Task[None] | None = None


class FrontProtocol(asyncio.Protocol):
    """This process's end of the front's socket: reads its frames, serves each call in a
    task of its own, and writes the answers."""

    def __init__(self, methods: dict[str, Method], callers: CallerCheck) -> None:
        self.methods = methods
        self.callers = callers
        self.loop = asyncio.get_running_loop()
        self.ready: asyncio.Future[int] = self.loop.create_future()
        # Whoever waited for it may have been cancelled (a `stop` during a restart): its
        # failure is then nobody's to read, and not logged as an unread exception.
        self.ready.add_done_callback(lambda f: f.cancelled() or f.exception())
        self.closed: asyncio.Future[None] = self.loop.create_future()
        self.calls: dict[int, _Call] = {}
        self.transport: asyncio.Transport | None = None
        self._buffer = bytearray()
        self._out: list[bytes] = []

    # -- the socket ---------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]  # uvloop's is not asyncio's class

    def connection_lost(self, exc: Exception | None) -> None:
        if not self.ready.done():
            self.ready.set_exception(RuntimeError("the gRPC front exited before it listened"))
        for call in self.calls.values():
            if call.task is not None:
                call.task.cancel()
        self.calls.clear()
        if not self.closed.done():
            self.closed.set_result(None)

    def data_received(self, data: bytes) -> None:
        buffer = self._buffer
        buffer += data
        at = 0
        end = len(buffer)
        while end - at >= 4:
            (length,) = _U32.unpack_from(buffer, at)
            if end - at - 4 < length:
                break
            _, kind, call = _HEAD.unpack_from(buffer, at)
            payload = bytes(buffer[at + 13 : at + 4 + length])
            at += 4 + length
            self._received(kind, call, payload)
        del buffer[:at]

    def send(self, frame: bytes) -> None:
        if not self._out:
            self.loop.call_soon(self._flush)
        self._out.append(frame)

    def _flush(self) -> None:
        if self.transport is not None and not self.transport.is_closing():
            self.transport.write(b"".join(self._out))
        self._out.clear()

    # -- the front's frames -------------------------------------------------------

    def _received(self, kind: int, call_id: int, payload: bytes) -> None:
        if kind == CALL:
            self._arrived(call_id, payload)
        elif kind in (MESSAGE, NO_MESSAGE):
            call = self.calls.get(call_id)
            if call is not None and call.message is not None and not call.message.done():
                call.message.set_result(payload if kind == MESSAGE else None)
        elif kind == CANCELLED:
            call = self.calls.pop(call_id, None)
            if call is not None and call.task is not None:
                call.task.cancel()
        elif kind == READY:
            if not self.ready.done():
                self.ready.set_result(_Reader(payload).u32())
        elif kind == FAILED:
            if not self.ready.done():
                reason = _Reader(payload).string().decode(errors="replace")
                self.ready.set_exception(RuntimeError(reason))
        else:
            log.error("scoring: the gRPC front sent a frame of unknown type %s", kind)

    def _arrived(self, call_id: int, payload: bytes) -> None:
        reader = _Reader(payload)
        reading = bool(reader.u32() & READING)
        method = reader.string().decode("latin-1")
        peer = reader.string().decode("latin-1")
        metadata = []
        for _ in range(reader.u32()):
            key = reader.string().decode("latin-1")
            metadata.append((key, _metadata_value(key, reader.string())))
        call = _Call()
        if reading:
            call.message = self.loop.create_future()
        self.calls[call_id] = call
        context = FrontContext(tuple(metadata), peer)
        call.task = self.loop.create_task(self._serve(call_id, call, method, context))

    # -- one call -----------------------------------------------------------------

    async def _serve(self, call_id: int, call: _Call, path: str, context: FrontContext) -> None:
        answer = b""
        approved = False
        try:
            method = self.methods.get(path)
            if method is None:
                await context.abort(grpc.StatusCode.UNIMPLEMENTED, "Method not found!")
                return
            await check_caller(self.callers, context, refuse)
            approved = True
            if call.message is None:
                call.message = self.loop.create_future()
                self.send(_frame(PROCEED, call_id))
            body = await call.message
            if body is None:
                await refuse(context, BadRequest(SENT_NO_MESSAGE))
                return
            answer = method.serialize(await method.handle(body, context))
        except aio.AbortError:
            pass
        except asyncio.CancelledError:
            # The client went away (CANCELLED took the call out of `calls`): no one to
            # answer. Anything else that cancels the handler still ends the call.
            if call_id in self.calls and not self.closed.done():
                context.code = grpc.StatusCode.CANCELLED
                context.details = "the call was cancelled"
                self.send(_finish(call_id, context, b"", approved))
            raise
        except Exception as e:
            # Raised outside the method's handler (its answer's serializer): `refuse`
            # logs it and ends the call as INTERNAL, as for the handler's own errors.
            with contextlib.suppress(aio.AbortError):
                await refuse(context, e)
        finally:
            self.calls.pop(call_id, None)
        self.send(_finish(call_id, context, answer, approved))


def _finish(call_id: int, context: FrontContext, answer: bytes, approved: bool) -> bytes:
    code = context.code.value[0]
    parts = [
        _U32.pack(APPROVED if approved else 0),
        _U32.pack(code),
        _string(context.details.encode()),
        _U32.pack(len(context.trailing)),
    ]
    for key, value in context.trailing:
        parts.append(_string(key.encode("latin-1")))
        parts.append(_string(value if isinstance(value, bytes) else value.encode("latin-1")))
    if code == 0:
        parts.append(answer)
    return _frame(FINISH, call_id, b"".join(parts))


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
        protocol.send(_frame(STOP, 0, _U32.pack(int((grace or 0) * 1000))))
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
