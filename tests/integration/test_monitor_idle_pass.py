"""What a monitor pass asks the database. A pass with nothing to do (learners running,
nothing queued, nothing to delete) reads the active trainings with their learners and the
queue, no more: four times a second on `dlaas up`, it shares the cores with the learners.
The deletion of a training that ends while its deletion is requested costs no query of its
own: the pass that ends it deletes it, and a sweep every DLAAS_MONITOR_FULL_PASS_SECONDS
finds those that ended elsewhere."""

from __future__ import annotations

import re
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import datetime, timedelta
from typing import Any

import pytest
from fastapi.testclient import TestClient
from sqlalchemy import event

from service.db import repository
from service.db.models import utcnow
from service.domain.lifecycle import LearnerObservation as L
from service.domain.states import TrainingState
from service.platform import Platform
from service.storage import keys
from service.trainings import record_transition
from tests.conftest import create_tenant, submit
from tests.fakes import Broker, Learners, two_learners
from worker.backends.base import Observation
from worker.monitor import Monitor

pytestmark = pytest.mark.integration

RUNNING = Observation((L(1, "RUNNING"), L(2, "RUNNING")), (1, 2))


@contextmanager
def statements(platform: Platform) -> Iterator[list[str]]:
    """The SQL statements sent while the block runs."""
    sent: list[str] = []

    def record(conn: Any, cursor: Any, statement: str, *args: Any) -> None:
        sent.append(statement)

    event.listen(platform.engine, "before_cursor_execute", record)
    try:
        yield sent
    finally:
        event.remove(platform.engine, "before_cursor_execute", record)


class Running:
    """A 2-learner training the monitor admitted and saw running, passes a second apart."""

    def __init__(self, client: TestClient, platform: Platform, broker: Broker) -> None:
        self.broker, self.learners = broker, Learners()
        self.platform, self.client = platform, client
        self.headers = create_tenant(client, "idle")
        r = submit(client, self.headers, two_learners())
        assert r.status_code == 201, r.text
        self.id: str = r.json()["id"]
        self.monitor = Monitor(platform, self.learners)
        self.now = utcnow()
        self.tick()  # admitted (and the first pass's sweep)
        self.learners.now = RUNNING
        self.tick()
        assert self.status() == "RUNNING"

    def tick(self, seconds: float = 1.0) -> datetime:
        self.now += timedelta(seconds=seconds)
        self.monitor.tick(now=self.now)
        return self.now

    def status(self) -> str | None:
        r = self.client.get(f"/v1/trainings/{self.id}", headers=self.headers)
        if r.status_code == 404:
            return None
        status: str = r.json()["status"]
        return status

    def delete(self) -> None:
        """Ask for its deletion while it runs (a stop request first)."""
        r = self.client.delete(f"/v1/trainings/{self.id}", headers=self.headers)
        assert r.status_code in (202, 204), r.text


@pytest.fixture
def running(client: TestClient, platform: Platform, monkeypatch: pytest.MonkeyPatch) -> Running:
    broker = Broker()
    monkeypatch.setattr(platform, "dispatcher", broker)
    return Running(client, platform, broker)


def test_an_idle_pass_reads_the_active_trainings_their_learners_and_the_queue(
    running: Running, platform: Platform
) -> None:
    with statements(platform) as sent:
        running.tick()
    read = [m.group(1) if (m := re.search(r"\bFROM\s+(\w+)", s)) else s for s in sent]
    assert read == ["trainings", "learners", "tenants"], sent
    assert running.status() == "RUNNING"


def test_a_training_the_pass_ends_is_deleted_by_that_pass(running: Running) -> None:
    running.delete()
    running.tick()  # the stop request is sent; the learners still run
    assert running.status() == "RUNNING"
    prefix = keys.training_prefix(running.id)
    assert list(running.platform.store.list(prefix))  # its code archive, at least
    running.learners.now = None  # the learners are gone: HALTED, and deleted at once
    running.tick()
    assert running.status() is None
    assert list(running.platform.store.list(prefix)) == []


def test_a_training_ended_elsewhere_is_deleted_by_the_next_sweep(
    running: Running, platform: Platform
) -> None:
    running.delete()
    # Ended by another process (a launch the worker failed), not by a monitor pass.
    with platform.sessions() as session:
        training = repository.training_by_id(session, running.id)
        assert training is not None
        record_transition(training, TrainingState.FAILED, "the launch failed")
        session.commit()
    running.learners.now = None
    every = platform.settings.monitor_full_pass_seconds
    running.tick(every / 4)
    assert running.status() == "FAILED"  # between two sweeps: not looked for
    running.tick(every)
    assert running.status() is None


def test_a_deletion_that_failed_is_tried_again_on_the_next_pass(
    running: Running, platform: Platform, monkeypatch: pytest.MonkeyPatch
) -> None:
    running.delete()
    running.learners.now = None
    calls: list[str] = []
    delete_prefix = platform.store.delete_prefix

    def store_down_once(prefix: str) -> Any:
        calls.append(prefix)
        if len(calls) == 1:
            raise OSError("the store is down")
        return delete_prefix(prefix)

    monkeypatch.setattr(platform.store, "delete_prefix", store_down_once)
    running.tick()
    assert running.status() == "HALTED" and len(calls) == 1
    running.tick(0.25)  # well before the next periodic sweep
    assert running.status() is None and len(calls) == 2
