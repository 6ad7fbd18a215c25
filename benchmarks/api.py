"""How much the API serves.

api_get_training: authenticated `GET /v1/trainings/{id}` requests/s at concurrency 32,
against a bare FastAPI JSON endpoint served with the same uvicorn settings (ratio ours /
bare). api_list_10k: p99 of `GET /v1/trainings?limit=50` with 10,000 trainings of the
tenant in PostgreSQL, against the same with 100 (ratio 10k / 100).

The load generator is an asyncio httpx client with a fixed number of connections.

    python benchmarks/api.py [--quick]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import httpx
import psycopg

from benchmarks.common import BIN, Row, dlaas_up, free_port, manifest, percentile, zip_code

PG_SERVER = os.environ.get("DLAAS_TEST_POSTGRES", "postgresql+psycopg://postgres@127.0.0.1:5432")
BARE_APP = """
from fastapi import FastAPI
app = FastAPI()
BODY = {"id": "abc", "name": "bench", "status": "RUNNING", "learners": [{"learner_id": 1}]}
@app.get("/bare")
def bare() -> dict:
    return BODY
"""


async def load(
    url: str, headers: dict[str, str], concurrency: int, seconds: float
) -> tuple[float, list[float]]:
    """Requests/s and latencies of `concurrency` clients hammering `url` for `seconds`."""
    latencies: list[float] = []
    limits = httpx.Limits(max_connections=concurrency, max_keepalive_connections=concurrency)
    async with httpx.AsyncClient(headers=headers, limits=limits, timeout=30) as http:
        deadline = time.monotonic() + seconds

        async def client() -> None:
            while time.monotonic() < deadline:
                start = time.perf_counter()
                r = await http.get(url)
                if r.status_code != 200:
                    raise RuntimeError(f"{url}: {r.status_code} {r.text[:200]}")
                latencies.append(time.perf_counter() - start)

        await http.get(url)  # warm up the connection and the server
        started = time.monotonic()
        await asyncio.gather(*(client() for _ in range(concurrency)))
        elapsed = time.monotonic() - started
    return len(latencies) / elapsed, latencies


def bare_server() -> tuple[str, subprocess.Popen[bytes], Path]:
    """The baseline: a FastAPI endpoint returning a small JSON body, same uvicorn defaults."""
    path = Path(tempfile.mkdtemp(prefix="dlaas-bare-")) / "bare_app.py"
    path.write_text(BARE_APP)
    port = free_port()
    proc = subprocess.Popen(
        # `dlaas up` serves with uvicorn's defaults at log level info (access log on).
        [str(BIN / "uvicorn"), f"{path.stem}:app", "--port", str(port), "--log-level", "info"],
        cwd=path.parent,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    url = f"http://127.0.0.1:{port}"
    for _ in range(300):
        try:
            if httpx.get(f"{url}/bare").status_code == 200:
                break
        except httpx.TransportError:
            time.sleep(0.05)
    return url, proc, path


def api_get_training(quick: bool) -> Row:
    seconds = 5 if quick else 15
    bare_url, bare, path = bare_server()
    try:
        bare_rps, _ = asyncio.run(load(f"{bare_url}/bare", {}, 32, seconds))
    finally:
        os.killpg(bare.pid, signal.SIGTERM)
        bare.wait()
        shutil.rmtree(path.parent)
    with dlaas_up(DLAAS_LOCAL_SLOTS="1") as platform, platform.client() as http:
        t = platform.submit(http, manifest("true"), zip_code({"a.py": ""}))
        platform.wait(http, t["id"], {"COMPLETED"})
        ours_rps, lat = asyncio.run(
            load(f"{platform.url}/v1/trainings/{t['id']}", platform.headers, 32, seconds)
        )
    return Row(
        "api_get_training",
        round(ours_rps, 1),
        "req/s",
        baseline=round(bare_rps, 1),
        ratio=round(ours_rps / bare_rps, 3),
        detail={
            "concurrency": 32,
            "seconds": seconds,
            "p99_s": round(percentile(lat, 99), 4),
            "database": "sqlite (embedded)",
            "target": "ratio >= 0.5",
        },
    )


def _seed(database_url: str, tenant_name: str, count: int) -> None:
    """`count` trainings of the tenant, inserted directly (the API would take minutes)."""
    dsn = database_url.replace("postgresql+psycopg", "postgresql")
    with psycopg.connect(dsn) as conn:
        tenant_id = conn.execute(
            "SELECT id FROM tenants WHERE name = %s", (tenant_name,)
        ).fetchone()[0]
        rows = [
            (
                f"b{uuid.uuid4().hex[:11]}",
                tenant_id,
                f"bench-{i}",
                "COMPLETED",
                "tensorflow",
                "2.21",
                "K80",
                1,
                '{"name": "bench"}',
                "trainings/x/model_definition.zip",
            )
            for i in range(count)
        ]
        with conn.cursor() as cur:
            cur.executemany(
                "INSERT INTO trainings (id, tenant_id, name, status, framework_name, "
                "framework_version, compute_name, nodes, manifest, model_definition_key, "
                "created_at, updated_at) VALUES (%s, %s, %s, %s, %s, %s, %s, %s, %s, %s, "
                "now() - random() * interval '30 days', now())",
                rows,
            )
        conn.execute("ANALYZE trainings")
        conn.commit()


def api_list(quick: bool) -> Row:
    seconds = 4 if quick else 10
    results = {}
    admin = PG_SERVER.replace("postgresql+psycopg", "postgresql") + "/postgres"
    for count in (100, 10_000):
        name = f"dlaas_bench_{os.getpid()}_{count}"
        with psycopg.connect(admin, autocommit=True) as conn:
            conn.execute(f'DROP DATABASE IF EXISTS "{name}"')
            conn.execute(f'CREATE DATABASE "{name}"')
        url = f"{PG_SERVER}/{name}"
        try:
            with dlaas_up(DLAAS_DATABASE_URL=url) as platform:
                _seed(url, "bench", count)
                _, lat = asyncio.run(
                    load(f"{platform.url}/v1/trainings?limit=50", platform.headers, 4, seconds)
                )
                results[count] = percentile(lat, 99)
        finally:
            with psycopg.connect(admin, autocommit=True) as conn:
                conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
    return Row(
        "api_list_10k",
        round(results[10_000], 4),
        "s (p99)",
        baseline=round(results[100], 4),
        ratio=round(results[10_000] / results[100], 3),
        detail={"limit": 50, "concurrency": 4, "database": "postgresql", "target": "ratio <= 1.5"},
    )


def run(quick: bool) -> list[Row]:
    return [api_get_training(quick).emit(), api_list(quick).emit()]


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--quick", action="store_true")
    run(parser.parse_args().quick)
