"""The API process's end of the gRPC front's socket (service/scoring/grpc_front.py
starts the front): the frames both ways, and `FrontProtocol`, which reads the front's
frames, serves each call on this event loop with the method's handler
(`grpc_api.PredictionService.unary_methods`, the same as grpcio's) and writes the answers.

Frames, both ways: u32 length (of what follows), u8 type, u64 call id, payload (the
integers little-endian; a string is a u32 length and its bytes); front.cc's header lists
them. Writes are gathered and sent once per turn of the event loop.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import struct
from collections.abc import Sequence

import grpc
from grpc import aio

from service.errors import BadRequest
from service.http.limits import CallerCheck
from service.scoring.grpc_api import Method, refuse
from service.scoring.grpc_gate import SENT_NO_MESSAGE, check_caller

log = logging.getLogger("dlaas.scoring")

READY, FAILED, CALL, MESSAGE, NO_MESSAGE, CANCELLED = 1, 2, 3, 4, 5, 6
PROCEED, FINISH, STOP = 10, 11, 12
READING = 1  # CALL's flag: the front reads the message already
APPROVED = 1  # FINISH's flag: the call passed the caller's check

_HEAD = struct.Struct("<IBQ")  # length, type, call id
_U32 = struct.Struct("<I")


def _frame(kind: int, call: int, payload: bytes = b"") -> bytes:
    return _HEAD.pack(9 + len(payload), kind, call) + payload


def stop_frame(grace: float | None) -> bytes:
    """STOP: the front refuses new calls and ends those under way after `grace` seconds."""
    return _frame(STOP, 0, _U32.pack(int((grace or 0) * 1000)))


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
