"""A load generator made for these benchmarks: HTTP/1.1 keep-alive over raw asyncio streams.

`concurrency` connections, each sending the same pre-encoded request as soon as it has the
answer to the previous one (a closed loop). It parses no more of a response than the status
line and Content-Length, so that on a machine it shares with the server it takes a small
share of the CPU (an httpx client spends several times the server's own time per request,
which caps the throughput it can measure and so flatters the slower server in a ratio).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from urllib.parse import urlsplit


@dataclass
class Load:
    """What one run measured: the requests answered after the warm-up, and how long."""

    latencies: list[float] = field(default_factory=list)
    elapsed: float = 0.0

    @property
    def per_second(self) -> float:
        return len(self.latencies) / self.elapsed if self.elapsed else 0.0


class HTTPStatusError(RuntimeError):
    pass


def encode_request(
    url: str, method: str = "GET", headers: dict[str, str] | None = None, body: bytes = b""
) -> tuple[str, int, bytes]:
    """(host, port, the request's bytes) for `url`."""
    parts = urlsplit(url)
    host, port = parts.hostname or "127.0.0.1", parts.port or 80
    target = parts.path + (f"?{parts.query}" if parts.query else "")
    lines = [f"{method} {target} HTTP/1.1", f"Host: {host}:{port}"]
    lines += [f"{k}: {v}" for k, v in (headers or {}).items()]
    if body or method in ("POST", "PUT", "PATCH"):
        lines.append(f"Content-Length: {len(body)}")
    return host, port, ("\r\n".join(lines) + "\r\n\r\n").encode() + body


async def _read_response(reader: asyncio.StreamReader) -> tuple[int, bytes]:
    head = await reader.readuntil(b"\r\n\r\n")
    status = int(head[9:12])
    length = 0
    chunked = False
    for line in head.split(b"\r\n")[1:]:
        name, _, value = line.partition(b":")
        lowered = name.strip().lower()
        if lowered == b"content-length":
            length = int(value)
        elif lowered == b"transfer-encoding" and b"chunked" in value.lower():
            chunked = True
    if not chunked:
        return status, await reader.readexactly(length)
    body = bytearray()
    while True:
        size = int((await reader.readuntil(b"\r\n")).split(b";")[0], 16)
        body += await reader.readexactly(size + 2)
        if size == 0:
            return status, bytes(body)


async def _run(url: str, request: bytes, concurrency: int, seconds: float, warmup: float) -> Load:
    host, port, _ = encode_request(url)
    result = Load()

    async def connection(
        until: float, record: bool, conn: tuple[asyncio.StreamReader, asyncio.StreamWriter]
    ) -> None:
        reader, writer = conn
        while (sent := time.perf_counter()) < until:
            writer.write(request)
            status, body = await _read_response(reader)
            if status >= 300:
                raise HTTPStatusError(f"{url}: {status} {body[:300]!r}")
            if record:
                result.latencies.append(time.perf_counter() - sent)

    conns = [await asyncio.open_connection(host, port) for _ in range(concurrency)]
    try:
        for conn in conns:
            conn[1].get_extra_info("socket").setsockopt(6, 1, 1)  # TCP_NODELAY
        warm_until = time.perf_counter() + warmup
        await asyncio.gather(*(connection(warm_until, False, c) for c in conns))
        start = time.perf_counter()
        await asyncio.gather(*(connection(start + seconds, True, c) for c in conns))
        result.elapsed = time.perf_counter() - start
    finally:
        for _, writer in conns:
            writer.close()
    return result


def hammer(
    url: str,
    *,
    method: str = "GET",
    headers: dict[str, str] | None = None,
    body: bytes = b"",
    concurrency: int = 1,
    seconds: float = 1.0,
    warmup: float = 0.25,
) -> Load:
    """`concurrency` keep-alive connections sending the request back to back for `seconds`
    (after `warmup` seconds of the same, not counted). Raises on any status >= 300."""
    _, _, request = encode_request(url, method, headers, body)
    with asyncio.Runner(loop_factory=_loop_factory()) as runner:
        return runner.run(_run(url, request, concurrency, seconds, warmup))


def _loop_factory() -> Callable[[], asyncio.AbstractEventLoop] | None:
    try:
        import uvloop  # uvicorn's own loop: the cheaper client
    except ImportError:
        return None
    return uvloop.new_event_loop


def hammer_grpc(
    target: str,
    method: str,
    *,
    request: bytes,
    metadata: tuple[tuple[str, str], ...] = (),
    concurrency: int = 1,
    seconds: float = 1.0,
    warmup: float = 0.25,
) -> Load:
    """The same closed loop over one gRPC channel (HTTP/2, `concurrency` calls in flight,
    one blocking call per thread: grpcio's synchronous client spent about 0.3 ms of CPU
    per call here against 0.35-0.7 ms for its asyncio one): the request serialized once,
    the answer's bytes not parsed. Raises on any status but OK."""
    import threading

    import grpc

    result = Load()
    errors: list[BaseException] = []
    with grpc.insecure_channel(target) as channel:
        call = channel.unary_unary(method)  # bytes in, bytes out

        def client(until: float, record: bool) -> None:
            try:
                while (sent := time.perf_counter()) < until:
                    call(request, metadata=metadata, timeout=60)
                    if record:
                        result.latencies.append(time.perf_counter() - sent)
            except BaseException as e:  # reported by the caller's thread
                errors.append(e)

        def run(until: float, record: bool) -> None:
            threads = [
                threading.Thread(target=client, args=(until, record)) for _ in range(concurrency)
            ]
            for thread in threads:
                thread.start()
            for thread in threads:
                thread.join()
            if errors:
                raise errors[0]

        run(time.perf_counter() + warmup, False)
        start = time.perf_counter()
        run(start + seconds, True)
        result.elapsed = time.perf_counter() - start
    return result
