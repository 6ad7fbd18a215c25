"""How much the API serves.

api_get_training: authenticated `GET /v1/trainings/{id}` requests/s at concurrency 32,
against a bare FastAPI JSON endpoint served with the same uvicorn settings (ratio ours /
bare); api_get_training_postgresql: the same with the platform on PostgreSQL, as a cluster
serves it (the API answers from the bodies it keeps, service/api/training_views.py).
api_list_10k: p99 of `GET /v1/trainings?limit=50` with 10,000 trainings of the
tenant in PostgreSQL, against the same with 100 (ratio 10k / 100).

The load generator is benchmarks/loadgen.py: keep-alive connections over raw asyncio
streams, each sending its next request as soon as it has the answer. (An httpx client
costs several times a bare endpoint's own time per request: it would measure itself.)

    python benchmarks/api.py [--quick]
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import psycopg

from benchmarks.common import (
    BIN,
    Row,
    dlaas_up,
    free_port,
    manifest,
    median,
    percentile,
    stop_process,
    wait_answering,
    zip_code,
)
from benchmarks.loadgen import hammer
from service.http.server import UVICORN_FLAGS

PG_SERVER = os.environ.get("DLAAS_TEST_POSTGRES", "postgresql+psycopg://postgres@127.0.0.1:5432")
BARE_APP = """
from fastapi import FastAPI
app = FastAPI()
BODY = {"id": "abc", "name": "bench", "status": "RUNNING", "learners": [{"learner_id": 1}]}
@app.get("/bare")
def bare() -> dict:
    return BODY
"""


def bare_server() -> tuple[str, subprocess.Popen[bytes], Path]:
    """The baseline: a FastAPI endpoint returning a small JSON body, same uvicorn defaults."""
    path = Path(tempfile.mkdtemp(prefix="dlaas-bare-")) / "bare_app.py"
    path.write_text(BARE_APP)
    port = free_port()
    proc = subprocess.Popen(
        # `dlaas up`'s settings: uvicorn's defaults (uvloop, httptools), log level info,
        # no access log, no proxy headers.
        [
            str(BIN / "uvicorn"),
            f"{path.stem}:app",
            "--port",
            str(port),
            "--log-level",
            "info",
            "--no-access-log",
            *UVICORN_FLAGS,
        ],
        cwd=path.parent,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    url = f"http://127.0.0.1:{port}"
    wait_answering(f"{url}/bare", proc, timeout=15)
    return url, proc, path


@contextmanager
def postgres_database(tag: str) -> Iterator[str]:
    """A fresh PostgreSQL database for one platform, dropped afterwards."""
    admin = PG_SERVER.replace("postgresql+psycopg", "postgresql") + "/postgres"
    name = f"dlaas_bench_{os.getpid()}_{tag}"
    with psycopg.connect(admin, autocommit=True) as conn:
        conn.execute(f'DROP DATABASE IF EXISTS "{name}"')
        conn.execute(f'CREATE DATABASE "{name}"')
    try:
        yield f"{PG_SERVER}/{name}"
    finally:
        with psycopg.connect(admin, autocommit=True) as conn:
            conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


def api_get_training(quick: bool, database_url: str | None = None) -> Row:
    """Both servers up at once, measured in turn, `repeats` times; medians. On the
    embedded platform (SQLite), or on `database_url` (a cluster's PostgreSQL)."""
    seconds, repeats = (2, 3) if quick else (5, 5)
    settings = {"DLAAS_LOCAL_SLOTS": "1"}
    if database_url:
        settings["DLAAS_DATABASE_URL"] = database_url
    bare_url, bare, path = bare_server()
    ours, baseline, latencies = [], [], []
    try:
        with dlaas_up(**settings) as platform, platform.client() as http:
            t = platform.submit(http, manifest("true"), zip_code({"a.py": ""}))
            platform.wait(http, t["id"], {"COMPLETED"})
            url = f"{platform.url}/v1/trainings/{t['id']}"
            for _ in range(repeats):
                baseline.append(hammer(f"{bare_url}/bare", concurrency=32, seconds=seconds))
                ours.append(hammer(url, headers=platform.headers, concurrency=32, seconds=seconds))
                latencies += ours[-1].latencies
    finally:
        stop_process(bare)
        shutil.rmtree(path.parent)
    ours_rps = median([r.per_second for r in ours])
    bare_rps = median([r.per_second for r in baseline])
    return Row(
        "api_get_training_postgresql" if database_url else "api_get_training",
        round(ours_rps, 1),
        "req/s",
        baseline=round(bare_rps, 1),
        ratio=round(ours_rps / bare_rps, 3),
        detail={
            "concurrency": 32,
            "seconds": seconds,
            "repeats": repeats,
            "p99_s": round(percentile(latencies, 99), 4),
            "database": "postgresql (as in a cluster)" if database_url else "sqlite (embedded)",
            "load_generator": "benchmarks/loadgen.py (asyncio streams, keep-alive)",
            "target": "ratio >= 0.7" if database_url else "ratio >= 0.5",
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
    for count in (100, 10_000):
        with postgres_database(str(count)) as url, dlaas_up(DLAAS_DATABASE_URL=url) as platform:
            _seed(url, "bench", count)
            run = hammer(
                f"{platform.url}/v1/trainings?limit=50",
                headers=platform.headers,
                concurrency=4,
                seconds=seconds,
            )
            results[count] = percentile(run.latencies, 99)
    return Row(
        "api_list_10k",
        round(results[10_000], 4),
        "s (p99)",
        baseline=round(results[100], 4),
        ratio=round(results[10_000] / results[100], 3),
        detail={"limit": 50, "concurrency": 4, "database": "postgresql", "target": "ratio <= 1.5"},
    )


def run(quick: bool) -> list[Row]:
    rows = [api_get_training(quick).emit()]
    with postgres_database("get") as url:
        rows.append(api_get_training(quick, url).emit())
    rows.append(api_list(quick).emit())
    return rows


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--quick", action="store_true")
    run(parser.parse_args().quick)
