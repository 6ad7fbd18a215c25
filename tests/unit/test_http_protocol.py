"""service.http.protocol: a response's head and body go out in one write, and nothing is
held longer than the event loop's next round of callbacks, nor more than one small write.
The transport under it is a recording fake; the loop is a real one."""

from __future__ import annotations

import asyncio
import functools
from collections.abc import Callable, Coroutine
from typing import Any

import pytest

from service.http.protocol import HELD_BYTES, OneWrite

HEAD = b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\n"


class Recording(asyncio.Transport):
    """What a connection's transport was asked to do, in order."""

    def __init__(self) -> None:
        super().__init__()
        self.calls: list[tuple[str, Any]] = []
        self.closing = False

    def write(self, data: Any) -> None:
        self.calls.append(("write", bytes(data)))

    def writelines(self, list_of_data: Any) -> None:
        self.calls.append(("writelines", [bytes(d) for d in list_of_data]))

    def close(self) -> None:
        self.calls.append(("close", None))
        self.closing = True

    def abort(self) -> None:
        self.calls.append(("abort", None))
        self.closing = True

    def is_closing(self) -> bool:
        return self.closing

    def get_write_buffer_size(self) -> int:
        return 100

    def set_protocol(self, protocol: asyncio.BaseProtocol) -> None:
        self.calls.append(("set_protocol", protocol))

    def get_extra_info(self, name: str, default: Any = None) -> Any:
        return {"peername": ("127.0.0.1", 5000)}.get(name, default)


def on_a_loop(test: Callable[..., Coroutine[Any, Any, None]]) -> Callable[..., None]:
    """The async test run to its end on a fresh event loop."""

    @functools.wraps(test)
    def run(*args: Any, **kwargs: Any) -> None:
        asyncio.run(test(*args, **kwargs))

    return run


async def _next_round() -> None:
    """Let the loop run the callbacks scheduled so far."""
    await asyncio.sleep(0)


@pytest.fixture
def transport() -> Recording:
    return Recording()


@on_a_loop
async def test_a_head_and_its_body_go_out_in_one_write(transport: Recording) -> None:
    one = OneWrite(transport, asyncio.get_running_loop())
    one.write(HEAD)
    assert transport.calls == []  # held for what follows
    one.write(b"ok")
    assert transport.calls == [("writelines", [HEAD, b"ok"])]
    await _next_round()
    assert transport.calls == [("writelines", [HEAD, b"ok"])]  # nothing sent twice


@on_a_loop
async def test_a_lone_write_goes_out_when_the_loop_runs_its_callbacks(
    transport: Recording,
) -> None:
    one = OneWrite(transport, asyncio.get_running_loop())
    one.write(HEAD)  # a stream's head, its first line not there yet
    assert transport.calls == []
    await _next_round()
    assert transport.calls == [("write", HEAD)]
    one.write(b"first line\n")
    await _next_round()
    assert transport.calls == [("write", HEAD), ("write", b"first line\n")]


@on_a_loop
async def test_a_large_write_is_never_held(transport: Recording) -> None:
    one = OneWrite(transport, asyncio.get_running_loop())
    big = b"x" * (HELD_BYTES + 1)
    one.write(big)
    assert transport.calls == [("write", big)]
    # After a held one, a large one goes with it, at once, as one call.
    one.write(HEAD)
    one.write(big)
    assert transport.calls[1:] == [("writelines", [HEAD, big])]


@on_a_loop
async def test_at_most_one_write_is_held(transport: Recording) -> None:
    one = OneWrite(transport, asyncio.get_running_loop())
    for i in range(5):
        one.write(b"%d" % i)
    assert transport.calls == [("writelines", [b"0", b"1"]), ("writelines", [b"2", b"3"])]
    assert one.get_write_buffer_size() == 100 + 1  # the held "4" counts as buffered
    await _next_round()
    assert transport.calls[-1] == ("write", b"4")
    assert one.get_write_buffer_size() == 100


@on_a_loop
async def test_closing_sends_what_is_held_first(transport: Recording) -> None:
    one = OneWrite(transport, asyncio.get_running_loop())
    one.write(HEAD)
    one.close()
    assert transport.calls == [("write", HEAD), ("close", None)]
    await _next_round()
    assert transport.calls == [("write", HEAD), ("close", None)]


@on_a_loop
async def test_an_abort_drops_what_is_held(transport: Recording) -> None:
    one = OneWrite(transport, asyncio.get_running_loop())
    one.write(HEAD)
    one.abort()
    await _next_round()
    assert transport.calls == [("abort", None)]


@on_a_loop
async def test_what_is_held_for_a_connection_closed_meanwhile_is_not_sent(
    transport: Recording,
) -> None:
    one = OneWrite(transport, asyncio.get_running_loop())
    one.write(HEAD)
    transport.closing = True  # the peer went away
    await _next_round()
    assert transport.calls == []
    one.write(b"late")  # passed on as is: the transport says what a closed one does
    assert transport.calls == [("write", b"late")]


@on_a_loop
async def test_an_upgrade_sends_what_the_old_protocol_wrote_first(transport: Recording) -> None:
    one = OneWrite(transport, asyncio.get_running_loop())
    one.write(b"HTTP/1.1 101 Switching Protocols\r\n\r\n")
    protocol = asyncio.Protocol()
    one.set_protocol(protocol)
    assert transport.calls == [
        ("write", b"HTTP/1.1 101 Switching Protocols\r\n\r\n"),
        ("set_protocol", protocol),
    ]
    assert one.get_extra_info("peername") == ("127.0.0.1", 5000)
