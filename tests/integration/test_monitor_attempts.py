"""The monitor and a retried training's attempts, pass by pass, with a scripted backend:
the learners of an attempt before the current one are never taken for the new attempt's,
the new attempt's launch is sent again only if it was lost, and a stop ends either."""

from __future__ import annotations

from datetime import timedelta

import pytest
from fastapi.testclient import TestClient

import worker.monitor
from service.db import repository
from service.db.models import utcnow
from service.dispatch import FINALIZE, LAUNCH
from service.domain.lifecycle import LearnerObservation as L
from service.platform import Platform
from service.storage.base import ObjectStore, StoreUnavailable
from tests.conftest import create_tenant, submit
from tests.fakes import Broker, Learners, two_learners
from worker import execution
from worker.backends.base import Observation
from worker.monitor import FINALIZE_RETRY, RESTART_RETRY, Monitor

pytestmark = pytest.mark.integration


RETRY = {"max_retries": 1, "retry_on_lost": True}


@pytest.fixture
def setup(
    client: TestClient, platform: Platform, monkeypatch: pytest.MonkeyPatch
) -> tuple[Monitor, Learners, Broker, str, dict[str, str]]:
    broker, learners = Broker(), Learners()
    monkeypatch.setattr(platform, "dispatcher", broker)
    headers = create_tenant(client, "retrying")
    doc = two_learners(retry_policy=RETRY)
    r = submit(client, headers, doc)
    assert r.status_code == 201, r.text
    return Monitor(platform, learners), learners, broker, r.json()["id"], headers


def test_the_old_attempts_learners_are_not_the_new_ones(
    setup: tuple[Monitor, Learners, Broker, str, dict[str, str]], client: TestClient
) -> None:
    monitor, learners, broker, tid, headers = setup
    start = utcnow()
    monitor.tick(now=start)  # admitted: PENDING, LAUNCH sent
    assert broker.sent == [(LAUNCH, tid)]
    learners.now = Observation((L(1, "RUNNING"), L(2, "RUNNING")), (1, 2))
    monitor.tick(now=start + timedelta(seconds=1))
    learners.now = Observation((L(1, "RUNNING"), L(2, "LOST")), (1, 2))
    monitor.tick(now=start + timedelta(seconds=2))
    t = client.get(f"/v1/trainings/{tid}", headers=headers).json()
    assert (t["status"], t["attempt"]) == ("PENDING", 2)
    assert broker.sent[-1] == (LAUNCH, tid)
    sent = len(broker.sent)
    # The old attempt's learners are still there (the launch is stopping them): their
    # failure is not the new attempt's, and nothing is sent again before RESTART_RETRY.
    learners.now = Observation((L(1, "FAILED", 1), L(2, "LOST")), (1, 2), attempt=1)
    monitor.tick(now=start + timedelta(seconds=3))
    t = client.get(f"/v1/trainings/{tid}", headers=headers).json()
    assert (t["status"], t["attempt"]) == ("PENDING", 2)
    assert len(broker.sent) == sent
    # A launch that was lost is sent again.
    monitor.tick(now=start + timedelta(seconds=3) + RESTART_RETRY)
    assert broker.sent[-1] == (LAUNCH, tid) and len(broker.sent) == sent + 1
    # The new attempt's learners are observed as the training's.
    learners.now = Observation((L(1, "RUNNING"), L(2, "RUNNING")), (1, 2), attempt=2)
    monitor.tick(now=start + timedelta(seconds=4) + RESTART_RETRY)
    learners.now = Observation((L(1, "COMPLETED", 0), L(2, "COMPLETED", 0)), (1, 2), attempt=2)
    monitor.tick(now=start + timedelta(seconds=5) + RESTART_RETRY)
    t = client.get(f"/v1/trainings/{tid}", headers=headers).json()
    assert (t["status"], t["attempt"]) == ("COMPLETED", 2)
    assert [e["status"] for e in t["status_history"]] == [
        "QUEUED",
        "PENDING",
        "RUNNING",
        "PENDING",
        "RUNNING",
        "COMPLETED",
    ]
    assert [e["attempt"] for e in t["status_history"]] == [1, 1, 1, 2, 2, 2]
    (past,) = t["past_attempts"]
    assert [(lr["learner_id"], lr["status"]) for lr in past["learners"]] == [
        (1, "HALTED"),
        (2, "LOST"),
    ]
    assert past["learners"][0]["status_message"].startswith("stopped by the platform")


def test_a_stop_while_the_old_attempt_is_ending_halts_the_training(
    setup: tuple[Monitor, Learners, Broker, str, dict[str, str]],
    client: TestClient,
    platform: Platform,
) -> None:
    monitor, learners, broker, tid, headers = setup
    start = utcnow()
    monitor.tick(now=start)
    learners.now = Observation((L(1, "RUNNING"), L(2, "LOST")), (1, 2))
    monitor.tick(now=start + timedelta(seconds=1))
    assert client.post(f"/v1/trainings/{tid}/stop", headers=headers).status_code in (200, 202)
    monitor.tick(now=start + timedelta(seconds=2))
    t = client.get(f"/v1/trainings/{tid}", headers=headers).json()
    assert (t["status"], t["attempt"]) == ("HALTED", 2)
    assert broker.sent[-1] == (FINALIZE, tid)
    with platform.sessions() as session:
        row = repository.training_by_id(session, tid)
        assert row is not None
        assert all(lr.status == "HALTED" for lr in row.learners)


def test_checkpoints_that_cannot_be_saved_end_the_training_naming_the_store(
    setup: tuple[Monitor, Learners, Broker, str, dict[str, str]],
    client: TestClient,
    platform: Platform,
) -> None:
    monitor, learners, _broker, tid, headers = setup
    start = utcnow()
    monitor.tick(now=start)
    learners.now = Observation((L(1, "RUNNING"), L(2, "LOST")), (1, 2))
    monitor.tick(now=start + timedelta(seconds=1))
    released: list[str] = []

    def unavailable(training_id: str, store: ObjectStore, prefix: str) -> int | None:
        raise StoreUnavailable("the S3 store at http://10.0.0.9:9000 (bucket 'dlaas') is down")

    learners.save_checkpoints = unavailable  # type: ignore[method-assign]
    learners.cleanup = released.append  # type: ignore[method-assign]
    execution.launch(platform, learners, tid)
    t = client.get(f"/v1/trainings/{tid}", headers=headers).json()
    assert t["status"] == "FAILED"
    assert t["status_message"].startswith(
        "attempt 2 of 2: the checkpoints of attempt 1 could not be saved: the S3 store at "
        "http://10.0.0.9:9000"
    )
    assert tid in released  # the old attempt's learners are released all the same


def test_an_ended_training_the_backend_still_holds_is_finalized_again(
    setup: tuple[Monitor, Learners, Broker, str, dict[str, str]],
    client: TestClient,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The FINALIZE sent when a training ended is lost (its worker was killed running it):
    while the backend still holds the training, the monitor sends it again, now and then."""
    monitor, learners, broker, tid, headers = setup
    held = [tid, "deleted-training"]
    monkeypatch.setattr(learners, "held", lambda: held)
    clock = [1000.0]
    monkeypatch.setattr(worker.monitor.time, "monotonic", lambda: clock[0])
    start = utcnow()
    monitor.tick(now=start)  # admitted
    learners.now = Observation((L(1, "RUNNING"), L(2, "RUNNING")), (1, 2))
    monitor.tick(now=start + timedelta(seconds=1))
    assert (FINALIZE, tid) not in broker.sent  # running: held, as it should be
    # The learners exit 0; the FINALIZE sent then is lost.
    learners.now = Observation((L(1, "COMPLETED", 0), L(2, "COMPLETED", 0)), (1, 2))
    monitor.tick(now=start + timedelta(seconds=2))
    assert client.get(f"/v1/trainings/{tid}", headers=headers).json()["status"] == "COMPLETED"
    assert broker.sent.count((FINALIZE, tid)) == 1
    # A training gone from the database that the backend still holds is released too.
    assert broker.sent.count((FINALIZE, "deleted-training")) == 1
    monitor.tick(now=start + timedelta(seconds=3))
    assert broker.sent.count((FINALIZE, tid)) == 1  # not again at once
    clock[0] += FINALIZE_RETRY + 1
    monitor.tick(now=start + timedelta(seconds=4))
    assert broker.sent.count((FINALIZE, tid)) == 2
    held.clear()  # released
    clock[0] += FINALIZE_RETRY + 1
    monitor.tick(now=start + timedelta(seconds=5))
    assert broker.sent.count((FINALIZE, tid)) == 2
