"""A load generator made for these benchmarks: HTTP/1.1 keep-alive over raw asyncio streams.

`concurrency` connections, each sending the same pre-encoded request as soon as it has the
answer to the previous one (a closed loop). It parses no more of a response than the status
line and Content-Length, so that on a machine it shares with the server it takes a small
share of the CPU (an httpx client spends several times the server's own time per request,
which caps the throughput it can measure and so flatters the slower server in a ratio).
"""

from __future__ import annotations

import asyncio
import re
import shutil
import struct
import subprocess
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
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


# Each answer of h2load's log (--log-file): when it was sent (µs), its HTTP status, and how
# long it took (µs).
_H2LOAD_LOG_LINE = re.compile(r"^\d+\t(\d+)\t(\d+)$")
_TIME_UNITS = {"us": 1e6, "ms": 1e3, "s": 1.0}


def hammer_grpc(
    target: str,
    method: str,
    *,
    request: bytes,
    answer_bytes: int,
    metadata: tuple[tuple[str, str], ...] = (),
    concurrency: int = 1,
    seconds: float = 1.0,
    warmup: float = 0.25,
) -> Load:
    """The same closed loop for a unary gRPC method: `concurrency` calls in flight on one
    HTTP/2 connection, by nghttp2's h2load (C), which costs a few percent of the CPU a call
    costs the server. grpcio's own client spent about 0.3 ms of CPU per call here (its
    asyncio one 0.35-0.7 ms): as much as the server, on the same two cores.

    h2load knows HTTP, not gRPC: a refused call is an HTTP 200 whose status is in its
    trailers, with no message. So every answer counted must have brought one message of
    `answer_bytes` bytes (the answer to `request`, measured by the caller with a gRPC
    client): the run raises unless the data received is exactly that for every call, and
    every call answered 200."""
    h2load = shutil.which("h2load")
    if h2load is None:
        raise RuntimeError(
            "the gRPC rows need h2load, nghttp2's benchmark client: `apt-get install "
            "nghttp2-client` (`make bench` installs it)"
        )
    frame = b"\0" + struct.pack(">I", len(request)) + request
    with tempfile.TemporaryDirectory(prefix="dlaas-h2load-") as tmp:
        body = Path(tmp) / "request"
        body.write_bytes(frame)

        def run(duration: float, log: Path | None) -> tuple[int, float]:
            argv = [h2load, "--clients=1", "--threads=1", f"--max-concurrent-streams={concurrency}"]
            argv += [f"--duration={max(1, round(duration * 1000))}ms", f"--data={body}"]
            argv += ["--header=content-type: application/grpc", "--header=te: trailers"]
            argv += [f"--header={k}: {v}" for k, v in metadata]
            argv += [f"--log-file={log}"] if log is not None else []
            argv.append(f"http://{target}{method}")
            out = subprocess.run(argv, capture_output=True, text=True, check=False)
            finished = re.search(r"finished in ([\d.]+)(us|ms|s),", out.stdout)
            if out.returncode != 0 or finished is None:
                raise RuntimeError(f"h2load failed ({out.returncode}): {out.stdout}{out.stderr}")
            done = _check_answers(out.stdout, len(frame) - len(request) + answer_bytes)
            return done, float(finished.group(1)) / _TIME_UNITS[finished.group(2)]

        run(warmup, None)
        log = Path(tmp) / "answers.log"
        done, elapsed = run(seconds, log)
        result = Load(elapsed=elapsed)
        for line in log.read_text().splitlines():
            parsed = _H2LOAD_LOG_LINE.match(line)
            if parsed is None or parsed.group(1) != "200":
                raise RuntimeError(f"h2load logged an answer that is not a 200: {line!r}")
            result.latencies.append(int(parsed.group(2)) / 1e6)
        if len(result.latencies) != done:
            raise RuntimeError(f"h2load logged {len(result.latencies)} answers of {done}")
    return result


def _check_answers(report: str, frame_bytes: int) -> int:
    """Every call h2load counted as done answered 200 with one message of `frame_bytes`
    (its 5-byte gRPC prefix included), and none failed; how many were done."""
    counts = re.search(
        r"requests: \d+ total, \d+ started, (\d+) done, (\d+) succeeded, (\d+) failed, "
        r"(\d+) errored, (\d+) timeout",
        report,
    )
    data = re.search(r"traffic: .*, [\d.]+\w*B \((\d+)\) data", report)
    if counts is None or data is None:
        raise RuntimeError(f"h2load's report is not understood: {report}")
    done, succeeded, failed, errored, timeout = (int(g) for g in counts.groups())
    if not done or succeeded != done or failed or errored or timeout:
        raise RuntimeError(f"h2load: not every call was answered 200: {report}")
    if int(data.group(1)) != done * frame_bytes:
        raise RuntimeError(
            f"h2load: {done} calls brought {data.group(1)} bytes of messages, not "
            f"{done} x {frame_bytes}: some were refused (a gRPC status in trailers): {report}"
        )
    return done
