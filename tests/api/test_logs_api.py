"""GET /v1/trainings/{id}/logs and /metrics through the app: pages, follows, the per-tenant
cap on followers, and metric regexes kept from before they ran on RE2.

What a real server adds (followers that hold no thread, disconnects) is in
tests/api/test_live_server.py."""

from __future__ import annotations

import io
import json
import time
from collections.abc import Callable
from typing import Any

import pytest
from fastapi import FastAPI
from fastapi.testclient import TestClient

from service.api.logs import NEXT_CURSOR, PAGE_BYTES, LogFollowers
from service.db.models import Training
from service.domain.states import TrainingState
from service.logs.base import LogRecord
from service.platform import Platform
from service.storage import keys
from service.trainings import record_transition
from tests.conftest import create_tenant, manifest_yaml, submit


def _app(client: TestClient) -> FastAPI:
    app = client.app
    assert isinstance(app, FastAPI)
    return app


def _followers(client: TestClient) -> LogFollowers:
    followers: LogFollowers = _app(client).state.log_followers
    return followers


def _tenant_id(platform: Platform, training_id: str) -> str:
    with platform.sessions() as session:
        row = session.get(Training, training_id)
        assert row is not None
        return row.tenant_id


def _complete(platform: Platform, training_id: str) -> None:
    with platform.sessions() as session:
        row = session.get(Training, training_id)
        assert row is not None
        for state in (TrainingState.PENDING, TrainingState.RUNNING, TrainingState.COMPLETED):
            record_transition(row, state, "test")
        session.commit()


@pytest.fixture
def training_id(client: TestClient, tenant: dict[str, str]) -> str:
    r = submit(client, tenant)
    assert r.status_code == 201, r.text
    tid: str = r.json()["id"]
    return tid


def test_a_plain_read_comes_in_pages_of_at_most_a_mebibyte(
    client: TestClient, tenant: dict[str, str], platform: Platform, training_id: str
) -> None:
    # 2.5 MiB of log: lines of the wrapper's largest size (64 KiB) and small ones.
    records = [
        LogRecord(1 + i % 2, 1_700_000_000.0 + i, f"{i:04d} " + "z" * (65_000 if i % 3 else 10))
        for i in range(60)
    ]
    platform.logs.append(training_id, records)
    url = f"/v1/trainings/{training_id}/logs"
    pages: list[bytes] = []
    params: dict[str, Any] = {}
    while True:
        r = client.get(url, params=params, headers=tenant)
        assert r.status_code == 200, r.text
        assert r.headers["content-type"].startswith("text/plain")
        assert len(r.content) <= PAGE_BYTES
        pages.append(r.content)
        if NEXT_CURSOR.lower() not in r.headers:
            break
        params = {"cursor": r.headers[NEXT_CURSOR]}
        assert len(pages) < 20
    # Each page but the last is full: the next line would not have fit.
    assert all(len(p) > PAGE_BYTES - 66_000 for p in pages[:-1])
    assert len(pages) == 3
    expected = "".join(r.render() + "\n" for r in records).encode()
    assert b"".join(pages) == expected
    # The filters still apply, page by page.
    learner_2 = client.get(url, params={"learner": 2}, headers=tenant)
    assert all(b"[learner 2]" in ln for ln in learner_2.content.splitlines())


def test_an_invalid_cursor_is_a_400_naming_it(
    client: TestClient, tenant: dict[str, str], training_id: str
) -> None:
    for follow in ("false", "true"):
        r = client.get(
            f"/v1/trainings/{training_id}/logs",
            params={"cursor": "###", "follow": follow},
            headers=tenant,
        )
        assert r.status_code == 400, r.text
        assert r.headers["content-type"] == "application/problem+json"
        assert r.json()["errors"][0]["field"] == "cursor"
    assert _followers(client).open(_tenant_id_of(client, training_id)) == 0


def _tenant_id_of(client: TestClient, training_id: str) -> str:
    platform: Platform = _app(client).state.platform
    return _tenant_id(platform, training_id)


def test_a_followed_log_of_an_ended_training_ends_and_gives_its_place_back(
    client: TestClient, tenant: dict[str, str], platform: Platform, training_id: str
) -> None:
    platform.logs.append(training_id, [LogRecord(1, time.time(), "only line")])
    _complete(platform, training_id)
    r = client.get(f"/v1/trainings/{training_id}/logs?follow=true", headers=tenant)
    assert r.status_code == 200
    assert r.text.endswith("[learner 1] only line\n")
    assert _followers(client).open(_tenant_id(platform, training_id)) == 0


def test_followers_above_the_cap_are_429_until_one_leaves(
    client: TestClient, tenant: dict[str, str], platform: Platform, training_id: str
) -> None:
    _complete(platform, training_id)
    followers = _followers(client)
    tenant_id = _tenant_id(platform, training_id)
    held = [followers.acquire(tenant_id) for _ in range(followers.limit)]
    url = f"/v1/trainings/{training_id}/logs?follow=true"
    r = client.get(url, headers=tenant)
    assert r.status_code == 429
    assert r.headers["content-type"] == "application/problem+json"
    assert int(r.headers["retry-after"]) > 0
    detail = r.json()["detail"]
    assert f"at most {followers.limit} logs" in detail
    assert f"has {followers.limit} open" in detail
    assert "DLAAS_MAX_LOG_FOLLOWERS_PER_TENANT" in detail
    # A plain read is not counted, and another tenant has its own count.
    assert client.get(url.replace("true", "false"), headers=tenant).status_code == 200
    other = create_tenant(client, "other")
    theirs = submit(client, other).json()["id"]
    _complete(platform, theirs)
    assert client.get(f"/v1/trainings/{theirs}/logs?follow=true", headers=other).status_code == 200
    held.pop()()
    held[0]()  # giving a place back twice gives back one place
    held[0]()
    assert followers.open(tenant_id) == followers.limit - 2
    assert client.get(url, headers=tenant).status_code == 200
    assert followers.open(tenant_id) == followers.limit - 2


def test_a_stream_that_fails_gives_its_place_back(
    client: TestClient,
    tenant: dict[str, str],
    platform: Platform,
    training_id: str,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    reads: list[int] = []
    real_read: Callable[..., Any] = platform.logs.read

    def failing_read(tid: str, cursor: str | None = None, limit: int = 10_000) -> Any:
        reads.append(limit)
        if limit > 0:
            raise OSError("the log store went away")
        return real_read(tid, cursor, limit)

    monkeypatch.setattr(platform.logs, "read", failing_read)
    # The answer has started (200) when the stream fails: the client sees it cut short.
    client.get(f"/v1/trainings/{training_id}/logs?follow=true", headers=tenant)
    assert reads
    assert _followers(client).open(_tenant_id(platform, training_id)) == 0


def test_the_follower_cap_is_a_setting(monkeypatch: pytest.MonkeyPatch) -> None:
    from service.settings import Settings

    assert Settings().max_log_followers_per_tenant == 8
    monkeypatch.setenv("DLAAS_MAX_LOG_FOLLOWERS_PER_TENANT", "64")
    assert Settings().max_log_followers_per_tenant == 64


def test_metrics_of_a_regex_re2_refuses_are_a_409_naming_it(
    client: TestClient, tenant: dict[str, str], platform: Platform, training_id: str
) -> None:
    with platform.sessions() as session:
        row = session.get(Training, training_id)
        assert row is not None
        row.manifest = {
            **row.manifest,
            "evaluation_metrics": [
                {"name": "loss", "regex": r"loss=([0-9.]+)"},
                {"name": "acc", "regex": r"acc=(?=\d)([0-9.]+)"},
            ],
        }
        session.commit()
    r = client.get(f"/v1/trainings/{training_id}/metrics", headers=tenant)
    assert r.status_code == 409, r.text
    assert [e["field"] for e in r.json()["errors"]] == ["/evaluation_metrics/1/regex"]


def _put_document(platform: Platform, training_id: str, learner: int, data: bytes) -> None:
    key = keys.tensorboard_metrics_key(training_id, learner)
    platform.store.put_stream(key, io.BytesIO(data), len(data))


def test_tensorboard_metrics_are_every_learners_stored_scalars_in_time_order(
    client: TestClient, tenant: dict[str, str], platform: Platform
) -> None:
    manifest = manifest_yaml(
        compute_configuration={"name": "P100", "nodes": 2},
        evaluation_metrics={"type": "tensorboard", "in": "$JOB_STATE_DIR/logs/tb"},
    )
    r = submit(client, tenant, manifest)
    assert r.status_code == 201, r.text
    training_id = r.json()["id"]
    with platform.sessions() as session:
        row = session.get(Training, training_id)
        assert row is not None
        assert row.manifest["evaluation_metrics"] == {
            "type": "tensorboard",
            "in": "$JOB_STATE_DIR/logs/tb",
        }
    # No learner has stored any yet.
    r = client.get(f"/v1/trainings/{training_id}/metrics", headers=tenant)
    assert r.status_code == 200 and r.json() == {}

    t0 = 1_700_000_000.0
    doc = {"format": 1, "learner": 1, "truncated": False}
    first = {"train/loss": [[0, t0, 1.0], [1, t0 + 2, 0.5]], "lr": [[0, t0, 0.1]]}
    second = {"train/loss": [[0, t0 + 1, 0.9]]}
    _put_document(platform, training_id, 1, json.dumps({**doc, "metrics": first}).encode())
    _put_document(platform, training_id, 2, json.dumps({**doc, "metrics": second}).encode())
    r = client.get(f"/v1/trainings/{training_id}/metrics", headers=tenant)
    assert r.status_code == 200, r.text
    assert r.json() == {
        "lr": [{"value": 0.1, "learner": 1, "timestamp": "2023-11-14T22:13:20.000Z", "step": 0}],
        "train/loss": [
            {"value": 1.0, "learner": 1, "timestamp": "2023-11-14T22:13:20.000Z", "step": 0},
            {"value": 0.9, "learner": 2, "timestamp": "2023-11-14T22:13:21.000Z", "step": 0},
            {"value": 0.5, "learner": 1, "timestamp": "2023-11-14T22:13:22.000Z", "step": 1},
        ],
    }

    # A document that is not one a learner writes is a 409 naming the learner, not a 500.
    _put_document(platform, training_id, 2, b'{"format": 1, "metrics": {"x": [[1]]}}')
    r = client.get(f"/v1/trainings/{training_id}/metrics", headers=tenant)
    assert r.status_code == 409, r.text
    assert r.headers["content-type"].startswith("application/problem+json")
    assert [e["field"] for e in r.json()["errors"]] == ["learner-2"]
