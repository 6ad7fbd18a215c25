"""Submissions at once (benchmarks/submit_throughput.py sends them eight at a time): every
one is accepted, queued, and has its own code archive stored, byte for byte; on the local
store and on S3 (moto's server), on SQLite and on PostgreSQL."""

from __future__ import annotations

import io
import os
import threading
import zipfile
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pytest
from fastapi.testclient import TestClient

from service.db import repository
from service.platform import Platform
from service.settings import Settings
from service.storage import keys
from tests.conftest import create_tenant, manifest_yaml

SUBMISSIONS = 16  # within the standard plan's 20 queued trainings
CONCURRENCY = 8


@pytest.fixture
def settings(settings_on_each_store: Settings) -> Settings:
    return settings_on_each_store


def archive(i: int) -> bytes:
    """A code archive of its own for each submission (256 KiB, incompressible)."""
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w") as z:
        z.writestr("train.py", f"print({i})\n")
        z.writestr("weights.bin", os.urandom(256 * 1024), compress_type=zipfile.ZIP_STORED)
    return buf.getvalue()


def test_concurrent_submissions_are_all_accepted_with_their_archives(
    client: TestClient, platform: Platform
) -> None:
    headers = create_tenant(client, "busy")
    archives = [archive(i) for i in range(SUBMISSIONS)]
    start = threading.Barrier(CONCURRENCY)

    def submit(i: int) -> tuple[int, dict[str, Any]]:
        if i < CONCURRENCY:
            start.wait()  # the first eight leave together
        r = client.post(
            "/v1/trainings",
            files={
                "manifest": ("m.yaml", manifest_yaml(name=f"t{i}")),
                "model_definition": ("code.zip", archives[i]),
            },
            headers=headers,
        )
        return r.status_code, r.json()

    with ThreadPoolExecutor(CONCURRENCY) as pool:
        answers = list(pool.map(submit, range(SUBMISSIONS)))

    assert [status for status, _ in answers] == [201] * SUBMISSIONS, answers
    ids = [body["id"] for _, body in answers]
    assert len(set(ids)) == SUBMISSIONS
    with platform.sessions() as session:
        queued = {c.training_id for c in repository.queued_candidates(session)}
    assert queued == set(ids)
    for i, training_id in enumerate(ids):
        assert answers[i][1]["name"] == f"t{i}"
        with platform.store.open(keys.model_definition_key(training_id, "zip")) as f:
            assert f.read() == archives[i]
