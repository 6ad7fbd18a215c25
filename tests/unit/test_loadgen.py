"""The benchmarks' load generator: what it sends, what it reads back, what it refuses."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Iterator

import pytest

from benchmarks.loadgen import HTTPStatusError, encode_request, hammer, hammer_grpc


class Server:
    """An HTTP/1.1 keep-alive server answering by path, remembering the requests."""

    def __init__(self) -> None:
        self.requests: list[bytes] = []
        self.loop = asyncio.new_event_loop()
        self.ready = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        asyncio.set_event_loop(self.loop)
        self.server = self.loop.run_until_complete(
            asyncio.start_server(self._serve, "127.0.0.1", 0)
        )
        self.port = self.server.sockets[0].getsockname()[1]
        self.ready.set()
        self.loop.run_forever()

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                length = 0
                for line in head.split(b"\r\n"):
                    if line.lower().startswith(b"content-length:"):
                        length = int(line.split(b":")[1])
                body = await reader.readexactly(length)
                self.requests.append(head + body)
                path = head.split(b" ")[1]
                if path == b"/chunked":
                    writer.write(
                        b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n"
                        b"5\r\nhello\r\n6\r\n world\r\n0\r\n\r\n"
                    )
                elif path == b"/fail":
                    writer.write(b"HTTP/1.1 500 Oops\r\nContent-Length: 4\r\n\r\nbad!")
                else:
                    writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok")
                await writer.drain()
        except (asyncio.IncompleteReadError, ConnectionError):
            writer.close()

    def __enter__(self) -> Server:
        self.thread.start()
        self.ready.wait(5)
        return self

    def __exit__(self, *exc: object) -> None:
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(5)


@pytest.fixture
def server() -> Iterator[Server]:
    with Server() as s:
        yield s


def test_request_bytes() -> None:
    host, port, request = encode_request(
        "http://127.0.0.1:8080/v1/x?limit=5", "POST", {"Authorization": "Bearer k"}, b"{}"
    )
    assert (host, port) == ("127.0.0.1", 8080)
    assert request == (
        b"POST /v1/x?limit=5 HTTP/1.1\r\nHost: 127.0.0.1:8080\r\n"
        b"Authorization: Bearer k\r\nContent-Length: 2\r\n\r\n{}"
    )


@pytest.mark.parametrize("path", ["/plain", "/chunked"])
def test_keep_alive_closed_loop(server: Server, path: str) -> None:
    load = hammer(
        f"http://127.0.0.1:{server.port}{path}",
        method="POST",
        body=b'{"a": 1}',
        concurrency=3,
        seconds=0.3,
        warmup=0.05,
    )
    assert len(load.latencies) > 10
    assert load.per_second == pytest.approx(len(load.latencies) / load.elapsed)
    # Every request went out whole, on keep-alive connections, none left half-read.
    assert len(server.requests) >= len(load.latencies)
    assert all(r.endswith(b'\r\n\r\n{"a": 1}') for r in server.requests)


def test_error_status_stops_the_run(server: Server) -> None:
    with pytest.raises(HTTPStatusError, match="500"):
        hammer(f"http://127.0.0.1:{server.port}/fail", seconds=0.2, warmup=0)


def test_grpc_closed_loop_sends_the_bytes_and_counts_only_whole_answers() -> None:
    """h2load sends the request with the metadata; the warm-up's calls are not counted; a
    call refused with a gRPC status (an HTTP 200 with no message) or an answer of another
    size than the one expected fails the run."""
    import grpc

    seen: list[tuple[bytes, str]] = []

    def echo(request: bytes, context: grpc.ServicerContext) -> bytes:
        key = dict(context.invocation_metadata()).get("authorization", "")
        seen.append((request, key))
        if request == b"refuse":
            context.abort(grpc.StatusCode.RESOURCE_EXHAUSTED, "over the limit")
        return request[::-1]

    from concurrent.futures import ThreadPoolExecutor

    server = grpc.server(ThreadPoolExecutor(4))
    handler = grpc.unary_unary_rpc_method_handler(echo)
    server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler("t.S", {"E": handler}),))
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    try:
        target = f"127.0.0.1:{port}"
        load = hammer_grpc(
            target,
            "/t.S/E",
            request=b"abc",
            answer_bytes=3,
            metadata=(("authorization", "Bearer k"),),
            concurrency=3,
            seconds=0.3,
            warmup=0.05,
        )
        assert load.latencies and load.per_second > 0
        assert all(0 < latency < 5 for latency in load.latencies)
        assert set(seen) == {(b"abc", "Bearer k")}
        assert len(seen) > len(load.latencies)  # the warm-up's calls are not counted
        with pytest.raises(RuntimeError, match="refused"):
            hammer_grpc(target, "/t.S/E", request=b"refuse", answer_bytes=6, seconds=0.1)
        with pytest.raises(RuntimeError, match="bytes of messages"):
            hammer_grpc(target, "/t.S/E", request=b"abc", answer_bytes=4, seconds=0.1)
    finally:
        server.stop(0)
