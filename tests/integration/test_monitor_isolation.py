"""No tenant can stall the monitor: 100 learners sending hostile status reports (garbage,
wrong types, huge values, learners that do not exist, a backend that raises) fail their own
trainings with a clear message, while the trainings of others, reconciled in the same
passes on the same database, progress as if the hostile ones were not there."""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager
from datetime import timedelta
from typing import Any

import pytest
from fastapi.testclient import TestClient

import worker.monitor
from service.db.models import Training, utcnow
from service.dispatch import FINALIZE, LAUNCH
from service.domain.lifecycle import LearnerObservation
from service.platform import Platform
from service.trainings import NOT_STARTED_AT_END, STOPPED_AT_END, record_learner_states
from tests.conftest import create_tenant, manifest_yaml, submit
from worker.backends.base import Observation, StartRequest
from worker.monitor import FAILING_GRACE, FAILING_PASSES, Monitor

L = LearnerObservation
NODES = 4  # learners of each hostile training
PASS = timedelta(seconds=15)  # the monitor's clock advances this much a pass


def _hostile_learners(lid: int, garbage: dict[str, Any]) -> tuple[LearnerObservation, ...]:
    """Learner `lid` of four sends `garbage`; the others report running."""
    now = time.time()
    reports: list[dict[str, Any]] = [
        {"learner_id": i, "phase": "RUNNING", "phases": (("RUNNING", now),)}
        for i in range(1, NODES + 1)
    ]
    reports[lid - 1] |= garbage
    return tuple(L(**report) for report in reports)


def _running() -> tuple[LearnerObservation, ...]:
    return tuple(L(i, "RUNNING") for i in range(1, NODES + 1))


def _raise(what: str) -> Observation:
    raise RuntimeError(f"{what}: secret detail from /var/lib/backend/state.json")


# What each hostile training's backend reports, and the status message it must end with.
HOSTILE: list[tuple[Callable[[], Any], str]] = [
    (
        lambda: Observation(_hostile_learners(3, {"phase": "🙂" * 1_000_000}), (1, 2, 3, 4)),
        "learner 3 sent a malformed status report: phase '🙂🙂🙂🙂🙂🙂🙂🙂🙂…' is not one of "
        "PENDING, DOWNLOADING, RUNNING, STORING, COMPLETED, FAILED, HALTED, LOST",
    ),
    (
        lambda: Observation(_hostile_learners(1, {"phase": None}), (1,)),
        "learner 1 sent a malformed status report: phase is null, not text",
    ),
    (
        lambda: Observation(_hostile_learners(2, {"phase": {"nested": [{"x": [1, 2]}]}}), (1,)),
        "learner 2 sent a malformed status report: phase is a dict, not text",
    ),
    (
        lambda: Observation(_hostile_learners(3, {"phase": "FAILED", "exit_code": "x"}), (1,)),
        "learner 3 sent a malformed status report: exit_code is a str, not an integer",
    ),
    (
        lambda: Observation(_hostile_learners(4, {"phase": "FAILED", "exit_code": 2**80}), (1,)),
        "learner 4 sent a malformed status report: exit_code is out of range (-255..255)",
    ),
    (
        lambda: Observation(_hostile_learners(1, {"exit_code": float("nan")}), (1,)),
        "learner 1 sent a malformed status report: exit_code is a float, not an integer",
    ),
    (
        lambda: Observation(_hostile_learners(2, {"exit_code": -(2**63) - 1}), (1,)),
        "learner 2 sent a malformed status report: exit_code is out of range (-255..255)",
    ),
    (
        lambda: Observation(_hostile_learners(3, {"message": "m" * 10 * 1024 * 1024}), (1,)),
        "learner 3 sent a malformed status report: message is 10485760 characters long, more "
        "than a status report may hold (65536)",
    ),
    (
        lambda: Observation(_hostile_learners(4, {"message": {"a": ["b"]}}), (1,)),
        "learner 4 sent a malformed status report: message is a dict, not text",
    ),
    (
        lambda: Observation(_hostile_learners(1, {"phases": (("RUNNING", "soon"),)}), (1,)),
        "learner 1 sent a malformed status report: the time of phase RUNNING is a str, "
        "not a number",
    ),
    (
        lambda: Observation(_hostile_learners(2, {"phases": (("RUNNING", -1.0),)}), (1,)),
        "learner 2 sent a malformed status report: the time of phase RUNNING lies outside "
        "the training's lifetime",
    ),
    (
        lambda: Observation(_hostile_learners(3, {"phases": (("STORING", 10**400),)}), (1,)),
        "learner 3 sent a malformed status report: the time of phase STORING lies outside "
        "the training's lifetime",
    ),
    (
        lambda: Observation(
            _hostile_learners(4, {"phases": (("RUNNING", float("inf")),)}), (1, 2, 3, 4)
        ),
        "learner 4 sent a malformed status report: the time of phase RUNNING is not a "
        "finite number",
    ),
    (
        lambda: Observation(_hostile_learners(1, {"phases": "RUNNING"}), (1,)),
        "learner 1 sent a malformed status report: phases is a str, not a mapping of phase "
        "names to times",
    ),
    (
        lambda: Observation(_hostile_learners(2, {"learner_id": "2"}), (1,)),
        "the status report of this training is malformed: a learner id is a str, not an integer",
    ),
    (
        # a learner this training does not have (another training's, say) reports completion
        lambda: Observation((*_running(), L(5, "COMPLETED", 0)), (1,)),
        "the status report of this training is malformed: it names learner 5, which this "
        "training does not have",
    ),
    (
        # the same learner twice: the second one claims success
        lambda: Observation((*_running(), L(1, "COMPLETED", 0)), (1,)),
        "the status report of this training is malformed: it names learner 1 twice",
    ),
    (
        # another training's (two) learners, all completed: must not complete this one
        lambda: Observation((L(1, "COMPLETED", 0), L(2, "COMPLETED", 0)), (1, 2)),
        "the status report of this training is malformed: it has no status for learner 3",
    ),
    (
        # no primary learner: everything would count as done
        lambda: Observation(_running(), ()),
        "the status report of this training is malformed: it names no primary learner",
    ),
    (
        lambda: Observation(_running(), (9,)),
        "the status report of this training is malformed: a primary learner is not a learner "
        "of this training",
    ),
    (
        lambda: Observation(("garbage",), (1,)),  # type: ignore[arg-type]
        "the status report of this training is malformed: a learner's report is a str",
    ),
    (
        lambda: {"learners": "garbage"},
        "the status report of this training is malformed: the backend returned dict",
    ),
    (
        lambda: Observation(_running(), (1,), notes=(b"\x00",)),  # type: ignore[arg-type]
        "the status report of this training is malformed: its notes are not a list of text",
    ),
    # The backend raises whenever it looks at these: failed after FAILING_PASSES passes.
    (
        lambda: _raise("observe failed"),
        f"the monitor could not observe or record this training for {FAILING_PASSES} passes "
        "in a row; it was failed rather than left running unwatched",
    ),
    (
        # recorded, but the database refuses what was written (see `poisoned`)
        lambda: Observation(_running(), (1, 2, 3, 4)),
        f"the monitor could not observe or record this training for {FAILING_PASSES} passes "
        "in a row; it was failed rather than left running unwatched",
    ),
]
POISONED = len(HOSTILE) - 1  # the index of the training whose recording the database refuses


def _normal(step: int) -> Observation:
    """A well-behaved two-learner training, `step` passes after its launch; its messages
    carry characters the database could not store as they are."""
    t = time.time()
    if step == 0:
        learners = tuple(L(i, "PENDING", phases=(("PENDING", t),)) for i in (1, 2))
    elif step == 1:
        times = (("PENDING", t - 3), ("DOWNLOADING", t - 2), ("RUNNING", t - 1))
        learners = tuple(L(i, "RUNNING", None, "epoch 1\x00\ud800\x1b[2J", times) for i in (1, 2))
    elif step == 2:
        learners = tuple(L(i, "STORING", None, "x" * 60_000, (("STORING", t),)) for i in (1, 2))
    else:
        learners = tuple(L(i, "COMPLETED", 0, None, (("COMPLETED", t),)) for i in (1, 2))
    return Observation(learners, (1, 2))


class ScriptedBackend:
    """Plays the learners of every training: each normal one progresses a phase a pass
    after its launch; each hostile one reports what HOSTILE says for it."""

    def __init__(self) -> None:
        self.hostile: dict[str, Callable[[], Any]] = {}
        self.launched: dict[str, int] = {}  # training id -> passes observed since the launch

    def start(self, request: StartRequest) -> None:
        raise AssertionError("the monitor never starts learners itself")

    def launch(self, training_id: str) -> None:
        self.launched.setdefault(training_id, 0)

    def observe(self, training_id: str) -> Observation | None:
        if training_id not in self.launched:
            return None
        if training_id in self.hostile:
            result: Observation | None = self.hostile[training_id]()
            return result
        step = self.launched[training_id]
        self.launched[training_id] = step + 1
        return _normal(step)

    def stop(self, training_id: str) -> None:
        pass

    def cleanup(self, training_id: str) -> None:
        pass

    def changed(self) -> set[str] | None:
        return None

    def held(self) -> list[str]:
        return []

    def slots(self) -> int:
        return 1000

    def changes(self, wake: Callable[[], None]) -> AbstractContextManager[None]:
        return contextlib.nullcontext()


class Broker:
    """Records what the monitor sends; a launch starts the learners at once."""

    def __init__(self, backend: ScriptedBackend) -> None:
        self.backend = backend
        self.sent: list[tuple[str, str]] = []

    def send(self, task: str, training_id: str) -> None:
        self.sent.append((task, training_id))
        if task == LAUNCH:
            self.backend.launch(training_id)


@pytest.fixture
def poisoned(monkeypatch: pytest.MonkeyPatch) -> Iterator[set[str]]:
    """Trainings whose learner rows get a value no database column takes (as if a check
    had let it through): the write fails at commit, after the transaction began."""
    ids: set[str] = set()

    def record(training: Training, observations: Any) -> None:
        record_learner_states(training, observations)
        if training.id in ids:
            training.learners[0].exit_code = 2**80

    monkeypatch.setattr(worker.monitor, "record_learner_states", record)
    yield ids


def test_hostile_reports_fail_their_own_trainings_and_no_other(
    client: TestClient,
    platform: Platform,
    monkeypatch: pytest.MonkeyPatch,
    poisoned: set[str],
) -> None:
    backend = ScriptedBackend()
    broker = Broker(backend)
    monkeypatch.setattr(platform, "dispatcher", broker)
    normal_tenant = create_tenant(client, "well-behaved")
    # The standard plan runs 8 trainings of a tenant at once: 4 hostile tenants.
    hostile_tenants = [create_tenant(client, f"hostile-{n}") for n in range(4)]
    hostile_manifest = manifest_yaml(compute_configuration={"name": "P100", "nodes": NODES})
    normal_manifest = manifest_yaml(compute_configuration={"name": "P100", "nodes": 2})

    # Submitted interleaved: in every pass, hostile trainings come before and after the
    # normal ones.
    hostile: dict[str, str] = {}  # training id -> the message it must fail with
    normal: list[str] = []
    for n, (script, message) in enumerate(HOSTILE):
        if n % 8 == 4:
            r = submit(client, normal_tenant, normal_manifest)
            assert r.status_code == 201, r.text
            normal.append(r.json()["id"])
        r = submit(client, hostile_tenants[n % 4], hostile_manifest)
        assert r.status_code == 201, r.text
        tid = r.json()["id"]
        backend.hostile[tid] = script
        hostile[tid] = message
        if n == POISONED:
            poisoned.add(tid)
    assert len(hostile) * NODES == 100 and len(normal) == 3

    monitor = Monitor(platform, backend)
    start = utcnow()
    history: list[dict[str, str]] = []
    for n in range(8):
        monitor.tick(now=start + n * PASS)  # a pass that raised would fail this test
        history.append(
            {
                tid: client.get(f"/v1/trainings/{tid}", headers=normal_tenant).json()["status"]
                for tid in normal
            }
        )

    # The normal trainings moved a phase each pass, exactly as they would alone.
    for tid in normal:
        assert [h[tid] for h in history] == [
            "PENDING", "PENDING", "RUNNING", "STORING", "COMPLETED", "COMPLETED", "COMPLETED",
            "COMPLETED",
        ]  # fmt: skip
        shown = client.get(f"/v1/trainings/{tid}", headers=normal_tenant).json()
        assert [e["status"] for e in shown["status_history"]] == [
            "QUEUED", "PENDING", "DOWNLOADING", "RUNNING", "STORING", "COMPLETED",
        ]  # fmt: skip
        assert (FINALIZE, tid) in broker.sent
    with platform.sessions() as session:
        for tid in normal:
            training = session.get(Training, tid)
            assert training is not None
            assert [lr.status for lr in training.learners] == ["COMPLETED", "COMPLETED"]

    # Each hostile training failed, for its own reason, and its learners are stopped.
    with platform.sessions() as session:
        for tid, message in hostile.items():
            training = session.get(Training, tid)
            assert training is not None
            assert (training.status, training.status_message) == ("FAILED", message)
            assert "secret" not in message and "Traceback" not in message
            assert (FINALIZE, tid) in broker.sent
            # Nothing a refused report said was recorded: the learners are what the
            # platform made them when the training ended (stopped, without an exit code).
            assert {(lr.status, lr.exit_code) for lr in training.learners} == {("HALTED", None)}
            assert {lr.status_message for lr in training.learners} <= {
                STOPPED_AT_END,
                NOT_STARTED_AT_END,
            }
    assert FAILING_PASSES * PASS >= FAILING_GRACE  # the raising ones got their grace


def test_a_training_that_recovers_is_not_failed(
    client: TestClient, tenant: dict[str, str], platform: Platform, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A backend that raises a few times, then answers, costs the training nothing."""
    backend = ScriptedBackend()
    monkeypatch.setattr(platform, "dispatcher", Broker(backend))
    tid = submit(
        client, tenant, manifest_yaml(compute_configuration={"name": "P100", "nodes": 2})
    ).json()["id"]
    failures = iter(range(FAILING_PASSES - 1))
    backend.hostile[tid] = lambda: (
        _raise("flaky") if next(failures, None) is not None else _normal(1)
    )
    monitor = Monitor(platform, backend)
    start = utcnow()
    for n in range(FAILING_PASSES + 1):
        monitor.tick(now=start + n * 4 * FAILING_GRACE)
    shown = client.get(f"/v1/trainings/{tid}", headers=tenant).json()
    assert shown["status"] == "RUNNING", shown


def test_an_error_fails_the_training_only_once_it_persists(
    client: TestClient, tenant: dict[str, str], platform: Platform, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Many quick passes that all raise are not enough: the errors must also last
    FAILING_GRACE, so that a hiccup of the backend fails nothing."""
    backend = ScriptedBackend()
    monkeypatch.setattr(platform, "dispatcher", Broker(backend))
    manifest = manifest_yaml(compute_configuration={"name": "P100", "nodes": 2})
    tid = submit(client, tenant, manifest).json()["id"]
    backend.hostile[tid] = lambda: _raise("down")
    monitor = Monitor(platform, backend)
    start = utcnow()
    monitor.tick(now=start)  # admitted and launched
    for _ in range(5 * FAILING_PASSES):
        monitor.tick(now=start + timedelta(seconds=1))
    assert client.get(f"/v1/trainings/{tid}", headers=tenant).json()["status"] == "PENDING"
    monitor.tick(now=start + timedelta(seconds=1) + FAILING_GRACE)
    shown = client.get(f"/v1/trainings/{tid}", headers=tenant).json()
    assert shown["status"] == "FAILED"
    assert shown["status_message"].startswith("the monitor could not observe or record this")
