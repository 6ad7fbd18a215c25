"""A tenant's reads while another floods the API.

noisy_neighbour_p99_ratio: a second tenant's `GET /v1/trainings/{id}` p99 (one request at
a time, as a dashboard or a client polls) while a first tenant, on the lite plan, floods
its own training's metrics, logs and `GET /v1/trainings/{id}` from FLOOD_CONNECTIONS
keep-alive connections, over the same p99 with no flood; target <= 2. The floods run in
a process of their own (the measuring client shares no interpreter with them), quiet and
flooded periods alternate `repeats` times, and the row is the median of the paired ratios.

`flood` and `flood_grpc` are the closed loops of benchmarks/loadgen.py that accept every
answer and count them by status, for floods that are meant to be refused
(tests/security/test_request_floods.py uses them too).

    python benchmarks/noisy_neighbour.py [--quick]
"""

from __future__ import annotations

import argparse
import asyncio
import multiprocessing
import sys
import threading
import time
from collections import Counter
from collections.abc import Sequence
from pathlib import Path
from typing import Any

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import httpx

from benchmarks.common import Row, dlaas_up, manifest, median, percentile, zip_code
from benchmarks.loadgen import _loop_factory, _read_response, encode_request, hammer

FLOOD_CONNECTIONS = 16


async def _flood(
    url: str, requests: Sequence[bytes], concurrency: int, seconds: float
) -> Counter[int]:
    host, port, _ = encode_request(url)
    statuses: Counter[int] = Counter()
    until = time.perf_counter() + seconds

    async def connection(offset: int) -> None:
        conn = None
        i = offset
        while time.perf_counter() < until:
            if conn is None:
                conn = await asyncio.open_connection(host, port)
            reader, writer = conn
            writer.write(requests[i % len(requests)])
            i += 1
            try:
                status, _ = await _read_response(reader)
            except (asyncio.IncompleteReadError, ConnectionError):
                writer.close()
                conn = None  # the server closed it: open another, as a flood would
                continue
            statuses[status] += 1
        if conn is not None:
            conn[1].close()

    await asyncio.gather(*(connection(c) for c in range(concurrency)))
    return statuses


def flood(
    url: str,
    paths: Sequence[str],
    headers: dict[str, str] | None = None,
    *,
    concurrency: int = FLOOD_CONNECTIONS,
    seconds: float = 2.0,
) -> dict[int, int]:
    """GETs of `paths` in turn on `concurrency` keep-alive connections for `seconds`,
    whatever the answers; how many of each status came back."""
    requests = [encode_request(f"{url}{path}", headers=headers)[2] for path in paths]
    with asyncio.Runner(loop_factory=_loop_factory()) as runner:
        return dict(runner.run(_flood(url, requests, concurrency, seconds)))


def flood_grpc(
    target: str,
    method: str,
    request: bytes,
    metadata: tuple[tuple[str, str], ...] = (),
    *,
    concurrency: int = FLOOD_CONNECTIONS,
    seconds: float = 2.0,
) -> dict[str, int]:
    """`concurrency` calls in flight on one channel for `seconds`; how many ended with
    each status code."""
    import grpc

    statuses: Counter[str] = Counter()
    lock = threading.Lock()
    until = time.perf_counter() + seconds
    options = [("grpc.max_send_message_length", -1)]
    with grpc.insecure_channel(target, options=options) as channel:
        call = channel.unary_unary(method)

        def client() -> None:
            while time.perf_counter() < until:
                try:
                    call(request, metadata=metadata, timeout=30)
                    code = "OK"
                except grpc.RpcError as e:
                    code = e.code().name  # type: ignore[attr-defined]
                with lock:
                    statuses[code] += 1

        threads = [threading.Thread(target=client) for _ in range(concurrency)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
    return dict(statuses)


def flood_call(kind: str, args: tuple[Any, ...], kwargs: dict[str, Any]) -> dict[Any, int]:
    """`flood(*args, **kwargs)` or `flood_grpc(...)` by name: what a process pool runs."""
    if kind == "grpc":
        return dict(flood_grpc(*args, **kwargs))
    return dict(flood(*args, **kwargs))


def quiet_p99(url: str, headers: dict[str, str], seconds: float) -> tuple[float, int]:
    """p99 of one GET at a time for `seconds`, and how many were made."""
    load = hammer(url, headers=headers, concurrency=1, seconds=seconds, warmup=0.1)
    return percentile(load.latencies, 99), len(load.latencies)


def tenant(url: str, admin: dict[str, str], name: str, plan: str) -> dict[str, str]:
    r = httpx.post(f"{url}/v1/tenants", json={"name": name, "plan": plan}, headers=admin)
    r.raise_for_status()
    return {"Authorization": f"Bearer {r.json()['api_key']}"}


def submit(url: str, headers: dict[str, str]) -> str:
    r = httpx.post(
        f"{url}/v1/trainings",
        files={
            "manifest": ("m.yaml", manifest("echo hello")),
            "model_definition": ("c.zip", zip_code({"a.py": ""})),
        },
        headers=headers,
    )
    r.raise_for_status()
    training_id: str = r.json()["id"]
    return training_id


def noisy_neighbour(quick: bool) -> Row:
    seconds, repeats = (2.0, 3) if quick else (4.0, 5)
    quiet, flooded, ratios = [], [], []
    served: Counter[int] = Counter()
    with dlaas_up(DLAAS_LOCAL_SLOTS="1") as platform:
        admin = {"Authorization": "Bearer bench-admin"}
        noisy = tenant(platform.url, admin, "noisy", "lite")
        reads = f"{platform.url}/v1/trainings/{submit(platform.url, platform.headers)}"
        own = submit(platform.url, noisy)
        paths = [
            f"/v1/trainings/{own}/metrics",
            f"/v1/trainings/{own}/logs",
            f"/v1/trainings/{own}",
        ]
        context = multiprocessing.get_context("spawn")
        with context.Pool(1) as pool:
            # A short flood first, not measured: the pool's process imports what a flood
            # needs on its first task, which took longer than the 0.3 s the measured floods
            # get to start, so the first pair measured next to no flood.
            pool.apply(flood_call, ("rest", (platform.url, paths, noisy), {"seconds": 0.3}))
            for _ in range(repeats):
                alone, _ = quiet_p99(reads, platform.headers, seconds)
                flooding = pool.apply_async(
                    flood_call,
                    ("rest", (platform.url, paths, noisy), {"seconds": seconds + 0.6}),
                )
                time.sleep(0.3)  # the flood under way
                during, _ = quiet_p99(reads, platform.headers, seconds)
                served.update(flooding.get())
                quiet.append(alone)
                flooded.append(during)
                ratios.append(during / alone)
    ratio = median(ratios)
    return Row(
        "noisy_neighbour_p99_ratio",
        round(median(flooded), 4),
        "s (p99)",
        baseline=round(median(quiet), 4),
        ratio=round(ratio, 3),
        detail={
            "flood": "lite-plan tenant: its training's metrics, logs and GET, "
            f"{FLOOD_CONNECTIONS} keep-alive connections",
            "flood_answers": {str(k): v for k, v in sorted(served.items())},
            "paired_ratios": [round(r, 3) for r in ratios],
            "seconds": seconds,
            "repeats": repeats,
            "target": "ratio <= 2",
        },
    )


def run(quick: bool) -> list[Row]:
    return [noisy_neighbour(quick).emit()]


def _main(argv: Any = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--quick", action="store_true")
    run(parser.parse_args(argv).quick)


if __name__ == "__main__":
    _main()
