"""A model call driven by the event loop: the frame written to the model process's
connection and its answer read back as the socket becomes writable and readable, with no
thread in between (service.scoring.process.ModelProcess.start_call uses it; the threads'
blocking path is ModelProcess.call).

`LoopCall` owns one connection for one call: it sends the frame (what the socket does not
take at once is written when it is writable), reads the answer with a
`model_wire.FrameReader` (bounded: the limits are the caller's, from the signature),
and ends once, with the answer or the exception that stopped it (Closed or OSError: the
process is gone; TimeoutError: no answer within the call's time; WireError: it broke the
format or a limit). It never blocks the loop and never interprets the answer.
"""

from __future__ import annotations

import asyncio
import socket
from collections.abc import Callable
from typing import Any

from service.scoring.model_wire import Frame, FrameReader

Answer = tuple[dict[str, Any], memoryview]
Done = Callable[[Answer | BaseException], None]


class LoopCall:
    def __init__(
        self,
        loop: asyncio.AbstractEventLoop,
        conn: socket.socket,
        frame: Frame,
        reader: FrameReader,
        timeout: float,
        done: Done,
    ) -> None:
        self._loop = loop
        self._conn = conn
        self._fd = conn.fileno()
        self._views = [memoryview(b).cast("B") for b in frame if len(b)]
        self._reader = reader
        self._done: Done | None = done
        self._writing = False
        self._reading = False
        self._timer = loop.call_later(timeout, self._timed_out, timeout)
        try:
            conn.setblocking(False)
            self._write()
        except BaseException as e:
            self._end(e)

    def _write(self) -> None:
        while self._views:
            try:
                sent = self._conn.sendmsg(self._views[:512])
            except (BlockingIOError, InterruptedError):
                if not self._writing:
                    self._writing = True
                    self._loop.add_writer(self._fd, self._writable)
                return
            while sent and self._views:
                if sent >= len(self._views[0]):
                    sent -= len(self._views[0])
                    self._views.pop(0)
                else:
                    self._views[0] = self._views[0][sent:]
                    sent = 0
        if self._writing:
            self._writing = False
            self._loop.remove_writer(self._fd)
        self._reading = True
        self._loop.add_reader(self._fd, self._readable)

    def _writable(self) -> None:
        try:
            self._write()
        except BaseException as e:
            self._end(e)

    def _readable(self) -> None:
        if self._done is None:
            return
        try:
            answer = self._reader.read_from(self._conn)
        except BaseException as e:
            self._end(e)
            return
        if answer is not None:
            self._end(answer)

    def _timed_out(self, timeout: float) -> None:
        self._end(TimeoutError(f"no answer in {timeout:g} s"))

    def _end(self, outcome: Answer | BaseException) -> None:
        done, self._done = self._done, None
        if done is None:
            return
        self._timer.cancel()
        if self._writing:
            self._loop.remove_writer(self._fd)
        if self._reading:
            self._loop.remove_reader(self._fd)
        done(outcome)
