"""Reads a tenant can make expensive for the API every tenant shares: each route's work is
bounded by what it returns, however large the training's log or results grew.

- GET .../metrics on a training with a log of 200,000 lines and 32 metric regexes reads
  nothing of the log store, and as many bytes of the object store as on a log of 1,000
  lines (the learners' stored documents: the points, not the log).
- GET .../logs on that log reads a page of it: at most PAGE_RECORDS records and
  PAGE_BYTES of text per call.
- GET .../results on a training with thousands of result files lists one page of them,
  reading from the store only what that page lists (with a cursor to the next).

Work is counted (store calls, records, bytes), not timed: the shared machine's load would
make times say nothing."""

from __future__ import annotations

import io
import json
from collections.abc import Iterator, Sequence
from typing import Any, BinaryIO

import pytest
from fastapi.testclient import TestClient

from service.api.logs import NEXT_CURSOR, PAGE_BYTES, PAGE_RECORDS
from service.logs.base import LogRecord, LogStore
from service.platform import Platform
from service.storage import keys
from service.storage.base import ObjectInfo, ObjectStore
from tests.conftest import manifest_yaml, submit

METRICS = [{"name": f"m{i}", "regex": rf"\bm{i}=([0-9.]+)"} for i in range(32)]
LARGE_LINES = 200_000
SMALL_LINES = 1_000
T0 = 1_700_000_000.0


class CountingLogs:
    """The platform's log store, counting what is read of it."""

    def __init__(self, inner: LogStore) -> None:
        self.inner = inner
        self.reads = 0
        self.records = 0

    def read(self, training_id: str, cursor: str | None = None, limit: int = 10_000) -> Any:
        records, after = self.inner.read(training_id, cursor, limit)
        self.reads += 1
        self.records += len(records)
        return records, after

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)


class _CountingReader(io.RawIOBase):
    def __init__(self, inner: BinaryIO, counter: CountingStore) -> None:
        self.inner = inner
        self.counter = counter

    def readable(self) -> bool:
        return True

    def read(self, size: int = -1) -> bytes:
        data = self.inner.read(size)
        self.counter.bytes_read += len(data)
        return data

    def close(self) -> None:
        self.inner.close()
        super().close()


class CountingStore:
    """The platform's object store, counting the bytes read and the objects listed."""

    def __init__(self, inner: ObjectStore) -> None:
        self.inner = inner
        self.bytes_read = 0
        self.listed = 0

    def open(self, key: str, *args: Any, **kwargs: Any) -> Any:
        return _CountingReader(self.inner.open(key, *args, **kwargs), self)

    def list(self, prefix: str, *args: Any, **kwargs: Any) -> Iterator[ObjectInfo]:
        for info in self.inner.list(prefix, *args, **kwargs):
            self.listed += 1
            yield info

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)


def _lines(count: int) -> list[str]:
    """A log of `count` lines: the same 1,000 metric lines (each of the 32 metrics in turn)
    spread through it, the rest other output."""
    every = count // SMALL_LINES
    return [
        f"step {i // every} m{(i // every) % 32}=0.{i // every} loss"
        if i % every == 0
        else f"{i:08d} " + "x" * 90
        for i in range(count)
    ]


def _document(learner: int, lines: Sequence[str]) -> bytes:
    """The document learner `learner`'s wrapper stores for `lines` (keys.log_metrics_key's
    format): each metric's points, [step, time, value]. The time stamps are those of the
    metric lines' order, so the two logs' documents are alike."""
    points: dict[str, list[list[Any]]] = {m["name"]: [] for m in METRICS}
    n = 0
    for line in lines:
        if line.startswith("step "):
            step, metric = line.split()[1:3]
            name, value = metric.split("=")
            points[name].append([int(step), T0 + n, float(value)])
            n += 1
    document = {"format": 1, "learner": learner, "truncated": False, "metrics": points}
    return json.dumps(document).encode()


def _training(client: TestClient, tenant: dict[str, str], platform: Platform, count: int) -> str:
    r = submit(client, tenant, manifest_yaml(evaluation_metrics=METRICS))
    assert r.status_code == 201, r.text
    training_id: str = r.json()["id"]
    lines = _lines(count)
    for start in range(0, count, 10_000):
        batch = lines[start : start + 10_000]
        platform.logs.append(
            training_id, [LogRecord(1, T0 + start + i, line) for i, line in enumerate(batch)]
        )
    data = _document(1, lines)
    # Where learner 1's wrapper stores them (keys.log_metrics_key).
    key = f"trainings/{training_id}/metrics/learner-1/log.json"
    platform.store.put_stream(key, io.BytesIO(data), len(data))
    return training_id


@pytest.fixture
def counted(
    platform: Platform, monkeypatch: pytest.MonkeyPatch
) -> tuple[CountingLogs, CountingStore]:
    logs, store = CountingLogs(platform.logs), CountingStore(platform.store)
    monkeypatch.setattr(platform, "logs", logs)
    monkeypatch.setattr(platform, "store", store)
    return logs, store


def test_a_metrics_read_costs_the_same_on_a_large_log_as_on_a_small_one(
    client: TestClient,
    tenant: dict[str, str],
    platform: Platform,
    counted: tuple[CountingLogs, CountingStore],
) -> None:
    logs, store = counted
    small = _training(client, tenant, platform, SMALL_LINES)
    large = _training(client, tenant, platform, LARGE_LINES)
    cost = {}
    answers = {}
    for training_id in (small, large):
        logs.reads = logs.records = store.bytes_read = 0
        r = client.get(f"/v1/trainings/{training_id}/metrics", headers=tenant)
        assert r.status_code == 200, r.text
        answers[training_id] = r.json()
        cost[training_id] = (logs.reads, logs.records, store.bytes_read)
    # The log store is not read at all; the object store as much for either log.
    assert cost[large][:2] == (0, 0), cost
    assert cost[small][:2] == (0, 0), cost
    assert cost[large][2] == cost[small][2] > 0, cost
    assert answers[large] == answers[small]
    assert sum(len(points) for points in answers[large].values()) == SMALL_LINES


def test_a_log_page_of_a_large_log_reads_one_page(
    client: TestClient,
    tenant: dict[str, str],
    platform: Platform,
    counted: tuple[CountingLogs, CountingStore],
) -> None:
    logs, _store = counted
    training_id = _training(client, tenant, platform, LARGE_LINES)
    url = f"/v1/trainings/{training_id}/logs"
    params: dict[str, str] = {}
    for _ in range(3):
        logs.records = 0
        r = client.get(url, params=params, headers=tenant)
        assert r.status_code == 200, r.text
        assert 0 < len(r.content) <= PAGE_BYTES
        # A page's records and a read batch of look-ahead at most, of 200,000.
        assert logs.records <= PAGE_RECORDS + 256, logs.records
        assert logs.records <= 2 * r.content.count(b"\n") + 256, logs.records
        params = {"cursor": r.headers[NEXT_CURSOR]}


RESULT_FILES = 2_500


def test_a_results_listing_is_paged_and_reads_only_its_page(
    client: TestClient,
    tenant: dict[str, str],
    platform: Platform,
    counted: tuple[CountingLogs, CountingStore],
) -> None:
    _logs, store = counted
    r = submit(client, tenant, manifest_yaml())
    training_id = r.json()["id"]
    for i in range(RESULT_FILES):
        # Nested, so the listing walks directories too (as LOG_DIR's files are).
        key = keys.result_key(training_id, f"d{i % 7}/f{i:05d}.txt")
        platform.store.put_stream(key, io.BytesIO(b"x"), 1)
    url = f"/v1/trainings/{training_id}/results"
    paths: list[str] = []
    params: dict[str, Any] = {"limit": 400}
    pages = 0
    while True:
        store.listed = 0
        r = client.get(url, params=params, headers=tenant)
        assert r.status_code == 200, r.text
        page = r.json()
        assert len(page["files"]) <= 400
        assert store.listed <= 401, store.listed  # the page and one to know more follow
        paths += [f["path"] for f in page["files"]]
        pages += 1
        if page["next_cursor"] is None:
            break
        params = {"limit": 400, "cursor": page["next_cursor"]}
        assert pages < 20
    assert pages == 7
    assert paths == sorted(paths) and len(set(paths)) == RESULT_FILES
    # The default page is 1,000 files; more is refused naming the field.
    store.listed = 0
    r = client.get(url, headers=tenant)
    assert len(r.json()["files"]) == 1000 and store.listed <= 1001
    r = client.get(url, params={"limit": 100_000}, headers=tenant)
    assert r.status_code in (400, 422), r.text
    assert r.headers["content-type"].startswith("application/problem+json")
    assert "limit" in r.text
