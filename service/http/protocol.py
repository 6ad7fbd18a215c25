"""The HTTP/1.1 protocol the platform's servers run: uvicorn's httptools protocol, with a
response's head and the start of its body sent in one write.

uvicorn writes a response's status line and headers when the app sends
`http.response.start`, and its body when the app sends `http.response.body`: two writes,
two system calls and two TCP segments for every small answer, and two reads on the
client's side. For a prediction of a small model, where the model's own call takes well
under a millisecond, that second write is a measurable part of what a call costs the
server (and the client, on the same cores).

`OneWrite` is the connection's transport with one small write held back: a write of at
most HELD_BYTES when nothing is held is kept, and sent with the next write (one system
call for both, `writelines`) or, if none comes, when the event loop next runs its
callbacks. So a head followed at once by its body goes out as one write, and a head whose
body comes later (a stream that waits for its first line) goes out as soon as the app
waits for it. At most one write is ever held, and never a large one: what the server
holds and what flow control sees stay what uvicorn's own transport would say, give or
take HELD_BYTES. Closing, or anything that ends the writing, sends what is held first.
"""

from __future__ import annotations

import asyncio
from typing import Any, cast

from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

# The largest write that is held back for the next one: a response's head, or a small body.
HELD_BYTES = 16 * 1024


class OneWrite(asyncio.Transport):
    """`transport` with one small write held for the next (the module's docstring)."""

    def __init__(self, transport: asyncio.Transport, loop: asyncio.AbstractEventLoop) -> None:
        super().__init__()
        self._transport = transport
        self._loop = loop
        self._held: bytes | None = None
        self._flush_handle: asyncio.Handle | None = None

    # -- writing -------------------------------------------------------------------------

    def write(self, data: bytes | bytearray | memoryview) -> None:
        held = self._held
        if held is not None:
            self._held = None
            # One system call for both (uvloop writes a list at once), and no copy of `data`.
            self._transport.writelines((held, data))
        elif len(data) <= HELD_BYTES and not self._transport.is_closing():
            self._held = bytes(data)
            if self._flush_handle is None:
                self._flush_handle = self._loop.call_soon(self._flush_soon)
        else:
            self._transport.write(data)

    def writelines(self, list_of_data: Any) -> None:
        self.write(b"".join(list_of_data))

    def _flush_soon(self) -> None:
        self._flush_handle = None
        self.flush()

    def flush(self) -> None:
        """Send what is held now (nothing if the connection is closing: it is not sent)."""
        held, self._held = self._held, None
        if held is not None and not self._transport.is_closing():
            self._transport.write(held)

    def get_write_buffer_size(self) -> int:
        return self._transport.get_write_buffer_size() + len(self._held or b"")

    def get_write_buffer_limits(self) -> tuple[int, int]:
        return self._transport.get_write_buffer_limits()

    def set_write_buffer_limits(self, high: int | None = None, low: int | None = None) -> None:
        self._transport.set_write_buffer_limits(high, low)

    def can_write_eof(self) -> bool:
        return self._transport.can_write_eof()

    def write_eof(self) -> None:
        self.flush()
        self._transport.write_eof()

    # -- ending --------------------------------------------------------------------------

    def close(self) -> None:
        self.flush()
        self._transport.close()

    def abort(self) -> None:
        self._held = None
        self._transport.abort()

    def is_closing(self) -> bool:
        return self._transport.is_closing()

    # -- the rest, as the connection's own transport -------------------------------------

    def get_extra_info(self, name: str, default: Any = None) -> Any:
        return self._transport.get_extra_info(name, default)

    def set_protocol(self, protocol: asyncio.BaseProtocol) -> None:
        self.flush()  # an upgrade: what the old protocol wrote goes first
        self._transport.set_protocol(protocol)

    def get_protocol(self) -> asyncio.BaseProtocol:
        return self._transport.get_protocol()

    def is_reading(self) -> bool:
        return self._transport.is_reading()

    def pause_reading(self) -> None:
        self._transport.pause_reading()

    def resume_reading(self) -> None:
        self._transport.resume_reading()


class HttpProtocol(HttpToolsProtocol):
    """uvicorn's httptools protocol writing through `OneWrite`."""

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # uvloop's transports have asyncio.Transport's methods without deriving from it.
        super().connection_made(OneWrite(cast(asyncio.Transport, transport), self.loop))
