"""How many trainings the API accepts per second.

submit_throughput: `POST /v1/trainings` (a manifest and a 1 MiB code archive, multipart) at
concurrency 8 on `dlaas up` with PostgreSQL (a fresh database, dropped afterwards) and an
S3 object store (moto's server), against a bare FastAPI endpoint served with the same
uvicorn settings that receives the same multipart upload and writes the archive to the same
S3 with the same client (minio). Ratio ours / bare, target >= 0.7.

The submitted trainings stay queued: one learner slot (DLAAS_LOCAL_SLOTS=1), taken by a
sleeping training first, so no learner competes with the API for the cores; the plan allows
as many queued trainings as the run submits. The run checks what the rate relies on: every
answer was 201 (the load generator raises on any other) and every accepted training is
queued with its archive stored. Both servers are measured in turn, `repeats` times; medians.

    python benchmarks/submit_throughput.py [--quick]
"""

from __future__ import annotations

import argparse
import contextlib
import io
import os
import shutil
import subprocess
import sys
import tempfile
import time
import zipfile
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import urlsplit

import httpx
import psycopg
import yaml
from minio import Minio
from minio.deleteobjects import DeleteObject

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.api import postgres_database
from benchmarks.common import (
    BIN,
    Row,
    dlaas_up,
    free_port,
    manifest,
    median,
    profiled,
    stop_process,
    wait_answering,
    zip_code,
)
from benchmarks.loadgen import Load, hammer
from service.http.server import UVICORN_FLAGS
from tests.s3_server import moto_server

ACCESS_KEY, SECRET_KEY = "AKIA-BENCH", "bench-secret"
BUCKET, BARE_BUCKET = "dlaas-bench", "bare-bench"
CONCURRENCY = 8
ARCHIVE_BYTES = 1024 * 1024
BARE_APP = """
import os, uuid
from fastapi import FastAPI, File, UploadFile
from minio import Minio
from minio.deleteobjects import DeleteObject

client = Minio(
    os.environ["BARE_S3"], os.environ["BARE_KEY"], os.environ["BARE_SECRET"],
    secure=False, region="us-east-1",
)
bucket = os.environ["BARE_BUCKET"]
app = FastAPI()

@app.post("/bare", status_code=201)
def bare(manifest: UploadFile = File(), model_definition: UploadFile = File()) -> dict:
    manifest.file.read()
    archive = model_definition.file
    length = archive.seek(0, 2)
    archive.seek(0)
    key = f"trainings/{uuid.uuid4().hex}/model_definition.zip"
    client.put_object(bucket, key, archive, length)
    return {"id": key}
"""
# The standard plan, with room in the queue for every training a run submits.
CATALOG = {
    "plans": {
        "standard": {
            "distributed": True,
            "max_nodes": 16,
            "max_concurrent_trainings": 8,
            "predictions_per_minute": 60_000,
            "max_queued_trainings": 1_000_000,
        }
    }
}


def archive() -> bytes:
    """A 1 MiB code archive: a script and incompressible data, as a model's weights are."""
    data = os.urandom(ARCHIVE_BYTES - 1024)
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w") as z:
        z.writestr("train.py", "print('hello')\n")
        z.writestr("weights.bin", data, compress_type=zipfile.ZIP_STORED)
    return buf.getvalue()


def multipart(manifest_text: str, code: bytes) -> tuple[bytes, str]:
    """The request body both servers receive, encoded once, and its Content-Type."""
    request = httpx.Request(
        "POST",
        "http://bench/",
        files={"manifest": ("m.yaml", manifest_text), "model_definition": ("c.zip", code)},
    )
    return request.read(), request.headers["Content-Type"]


@contextlib.contextmanager
def bare_server(s3: str) -> Iterator[str]:
    """The baseline endpoint, with `dlaas up`'s uvicorn settings; its URL."""
    path = Path(tempfile.mkdtemp(prefix="dlaas-bare-")) / "bare_submit.py"
    path.write_text(BARE_APP)
    port = free_port()
    env = {
        **os.environ,
        "BARE_S3": s3,
        "BARE_KEY": ACCESS_KEY,
        "BARE_SECRET": SECRET_KEY,
        "BARE_BUCKET": BARE_BUCKET,
    }
    proc = subprocess.Popen(
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
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    try:
        wait_answering(f"http://127.0.0.1:{port}/openapi.json", proc, timeout=30)
        yield f"http://127.0.0.1:{port}"
    finally:
        stop_process(proc)
        shutil.rmtree(path.parent)


def empty_bucket(s3: Minio, bucket: str) -> None:
    """Remove every object of the bucket (what one run stored)."""
    names = [DeleteObject(o.object_name) for o in s3.list_objects(bucket, recursive=True)]
    for error in s3.remove_objects(bucket, names):
        raise RuntimeError(f"could not remove {error.name} from {bucket}: {error.message}")


def check_accepted(database_url: str, s3: Minio, expected: int, checked: set[str]) -> None:
    """At least `expected` trainings queued besides those of `checked` (their archives'
    keys: earlier runs', checked and removed), and each one's archive in the bucket; adds
    their keys to `checked`. Raises if not."""
    dsn = database_url.replace("postgresql+psycopg", "postgresql")
    with psycopg.connect(dsn) as conn:
        rows = conn.execute(
            "SELECT model_definition_key FROM trainings WHERE status = 'QUEUED'"
        ).fetchall()
    keys = {key for (key,) in rows} - checked
    if len(keys) < expected:
        raise RuntimeError(f"{len(keys)} trainings queued, {expected} accepted")
    stored = {o.object_name for o in s3.list_objects(BUCKET, prefix="trainings/", recursive=True)}
    if missing := keys - stored:
        raise RuntimeError(f"{len(missing)} accepted trainings have no stored archive")
    checked |= keys


def run(quick: bool) -> list[Row]:
    seconds, repeats = (3, 3) if quick else (5, 5)
    code = archive()
    body, content_type = multipart(manifest("python3 train.py"), code)
    ours: list[Load] = []
    baseline: list[Load] = []
    checked: set[str] = set()
    with (
        moto_server() as s3_server,
        postgres_database("submit") as database_url,
        tempfile.TemporaryDirectory(prefix="dlaas-bench-") as tmp,
    ):
        s3 = urlsplit(s3_server.url).netloc
        client = Minio(s3, ACCESS_KEY, SECRET_KEY, secure=False, region="us-east-1")
        client.make_bucket(BARE_BUCKET)
        catalog = Path(tmp) / "catalog.yaml"
        catalog.write_text(yaml.safe_dump(CATALOG))
        settings = {
            "DLAAS_DATABASE_URL": database_url,
            "DLAAS_S3_ENDPOINT": f"http://{s3}",
            "DLAAS_S3_ACCESS_KEY": ACCESS_KEY,
            "DLAAS_S3_SECRET_KEY": SECRET_KEY,
            "DLAAS_S3_BUCKET": BUCKET,
            "DLAAS_CATALOG_FILE": str(catalog),
            "DLAAS_LOCAL_SLOTS": "1",
        }
        with (
            bare_server(s3) as bare_url,
            dlaas_up(**settings) as platform,
            platform.client() as http,
        ):
            sleeper = platform.submit(http, manifest("sleep 600"), zip_code({"a.py": ""}))
            platform.wait(http, sleeper["id"], {"RUNNING"})
            headers = {**platform.headers, "Content-Type": content_type}
            for i in range(repeats):
                # In turn, the order swapped every pair: moto's server slows as it holds
                # more archives (each run stores a few hundred MiB), so whichever ran
                # second was the slower. Each run's archives are checked, then removed.
                for which in ("bare", "ours") if i % 2 == 0 else ("ours", "bare"):
                    if which == "bare":
                        baseline.append(
                            hammer(
                                f"{bare_url}/bare",
                                method="POST",
                                headers={"Content-Type": content_type},
                                body=body,
                                concurrency=CONCURRENCY,
                                seconds=seconds,
                            )
                        )
                        empty_bucket(client, BARE_BUCKET)
                        continue
                    with profiled(platform.process.pid, f"submit-{len(ours)}"):
                        load = hammer(
                            f"{platform.url}/v1/trainings",
                            method="POST",
                            headers=headers,
                            body=body,
                            concurrency=CONCURRENCY,
                            seconds=seconds,
                        )
                    ours.append(load)
                    time.sleep(0.5)
                    check_accepted(database_url, client, len(load.latencies), checked)
                    empty_bucket(client, BUCKET)
            http.post(f"/v1/trainings/{sleeper['id']}/stop")
    ours_rate = median([r.per_second for r in ours])
    bare_rate = median([r.per_second for r in baseline])
    ratio = median([o.per_second / b.per_second for o, b in zip(ours, baseline, strict=True)])
    return [
        Row(
            "submit_throughput",
            round(ours_rate, 1),
            "trainings/s",
            baseline=round(bare_rate, 1),
            ratio=round(ratio, 3),
            detail={
                "ratio": "median over the pairs of ours / bare (the order swapped every pair)",
                "concurrency": CONCURRENCY,
                "archive_bytes": len(code),
                "seconds": seconds,
                "repeats": repeats,
                "runs": [round(r.per_second, 1) for r in ours],
                "bare_runs": [round(r.per_second, 1) for r in baseline],
                "p50_s": round(median([x for r in ours for x in r.latencies]), 3),
                "bare_p50_s": round(median([x for r in baseline for x in r.latencies]), 3),
                "database": "postgresql",
                "object_store": "S3 (moto's server), both",
                "checked": "every answer 201; every accepted training queued, its archive stored",
                "target": "ratio >= 0.7",
            },
        ).emit()
    ]


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--quick", action="store_true")
    run(parser.parse_args().quick)
