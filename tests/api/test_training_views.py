"""The training bodies an API process keeps on PostgreSQL (service.api.training_views):
never stale after the process's own writes, current within the bound after another
process's, another tenant's request never answered from them."""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager

import psycopg
import pytest
from fastapi.testclient import TestClient
from sqlalchemy import Engine, text

from service.api.training_views import TrainingViews
from service.db.changes import APPLICATION_NAME, TRAINING_CHANNEL, TrainingChanges
from service.db.models import Training
from service.db.session import make_engine, make_sessionmaker, upgrade
from service.domain.lifecycle import LearnerObservation
from service.domain.states import TrainingState
from service.platform import Platform
from service.trainings import record_learner_states, record_transition
from tests.conftest import PG_SERVER, create_tenant, submit


def _views(client: TestClient) -> TrainingViews | None:
    views: TrainingViews | None = client.app.state.training_views  # type: ignore[attr-defined]
    return views


def _until(condition: Callable[[], bool], what: str, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"not within {timeout} s: {what}")
        time.sleep(0.01)


def _kept(client: TestClient, tenant: dict[str, str], training_id: str) -> dict[str, object]:
    """GET the training until the process answers it from what it keeps (PostgreSQL,
    once its listener caught up); on SQLite a plain GET."""
    body: dict[str, object] = client.get(f"/v1/trainings/{training_id}", headers=tenant).json()
    views = _views(client)
    if views is not None:
        tenant_id = client.get("/v1/usage", headers=tenant).json()["tenant_id"]
        _until(
            lambda: (
                client.get(f"/v1/trainings/{training_id}", headers=tenant).status_code == 200
                and views.get(tenant_id, training_id) is not None
            ),
            "the body is kept",
        )
    return body


# -- the keeping rules, without a database ----------------------------------------------


def test_a_body_is_answered_only_while_the_listener_is_current() -> None:
    views = TrainingViews(bound=0.25)
    views.put("acme", "t1", b"{}", views.mark())
    assert views.get("acme", "t1") is None  # never caught up: nothing is answered
    views.caught_up(time.monotonic())
    assert views.get("acme", "t1") == b"{}"
    assert views.get("other", "t1") is None  # another tenant's request reads the database
    views.caught_up(time.monotonic() - 1.0)  # an older report moves nothing back
    assert views.get("acme", "t1") == b"{}"
    lagging = TrainingViews(bound=0.25)
    lagging.put("acme", "t1", b"{}", lagging.mark())
    lagging.caught_up(time.monotonic() - 0.3)  # the listener lags by more than the bound
    assert lagging.get("acme", "t1") is None
    views.lost()
    assert views.get("acme", "t1") is None
    views.caught_up(time.monotonic())
    assert views.get("acme", "t1") is None  # what was kept before the loss is gone


def test_a_read_that_began_before_a_change_is_not_kept() -> None:
    views = TrainingViews(bound=60)
    views.caught_up(time.monotonic())
    before = views.mark()
    views.forget(["t1"])  # a change commits while the read is on its way
    views.put("acme", "t1", b"old", before)
    assert views.get("acme", "t1") is None
    views.put("acme", "t1", b"new", views.mark())
    assert views.get("acme", "t1") == b"new"
    # Another training's change does not refuse it.
    before = views.mark()
    views.forget(["t2"])
    views.put("acme", "t3", b"three", before)
    assert views.get("acme", "t3") == b"three"
    # Nor does a loss of everything that happened before the read.
    before = views.mark()
    views.lost()
    views.caught_up(time.monotonic())
    views.put("acme", "t1", b"stale", before)
    assert views.get("acme", "t1") is None


def test_at_its_size_it_starts_over() -> None:
    views = TrainingViews(bound=60, size=2)
    views.caught_up(time.monotonic())
    for name in ("a", "b", "c"):
        views.put("acme", name, name.encode(), views.mark())
    assert [views.get("acme", n) for n in ("a", "b", "c")] == [None, None, b"c"]


# -- on SQLite and PostgreSQL -----------------------------------------------------------


def test_own_commits_forget_what_they_wrote(
    client: TestClient, tenant: dict[str, str], platform: Platform
) -> None:
    """Any commit of the platform's sessions forgets the trainings it wrote, as it
    returns: the learners alone, a transition, a deletion (no notification needed)."""
    training_id = submit(client, tenant).json()["id"]
    views = TrainingViews(bound=60)  # no listener: only this process's commits
    views.watch(platform.sessions)
    try:
        views.caught_up(time.monotonic())

        def keep() -> None:
            views.put("acme", training_id, b"kept", views.mark())
            assert views.get("acme", training_id) == b"kept"

        keep()
        with platform.sessions() as session:
            session.get(Training, training_id)  # read only: nothing forgotten
            session.commit()
        assert views.get("acme", training_id) == b"kept"
        with platform.sessions() as session:
            training = session.get(Training, training_id)
            assert training is not None
            record_learner_states(
                training,
                [LearnerObservation(learner_id=1, phase="DOWNLOADING", exit_code=None)],
            )
            assert views.get("acme", training_id) == b"kept"  # not before the commit
            session.commit()
        assert views.get("acme", training_id) is None
        keep()
        with platform.sessions() as session:
            training = session.get(Training, training_id)
            assert training is not None
            record_transition(training, TrainingState.PENDING)
            session.commit()
        assert views.get("acme", training_id) is None
        keep()
        with platform.sessions() as session:
            session.delete(session.get(Training, training_id))
            session.commit()
        assert views.get("acme", training_id) is None
    finally:
        views.unwatch(platform.sessions)


def test_reads_after_the_clients_own_stop_and_delete_are_current(
    client: TestClient, tenant: dict[str, str]
) -> None:
    training_id = submit(client, tenant).json()["id"]
    assert _kept(client, tenant, training_id)["status"] == "QUEUED"
    stopped = client.post(f"/v1/trainings/{training_id}/stop", headers=tenant)
    assert stopped.status_code == 200
    read = client.get(f"/v1/trainings/{training_id}", headers=tenant).json()
    assert read == stopped.json() and read["status"] == "HALTED"
    assert _kept(client, tenant, training_id)["status"] == "HALTED"
    assert client.delete(f"/v1/trainings/{training_id}", headers=tenant).status_code == 204
    assert client.get(f"/v1/trainings/{training_id}", headers=tenant).status_code == 404


def test_another_tenant_is_never_answered_from_what_is_kept(
    client: TestClient, tenant: dict[str, str]
) -> None:
    training_id = submit(client, tenant).json()["id"]
    kept = _kept(client, tenant, training_id)
    other = create_tenant(client, "someone-else")
    r = client.get(f"/v1/trainings/{training_id}", headers=other)
    assert r.status_code == 404
    assert r.headers["content-type"] == "application/problem+json"
    # Its request neither forgot nor replaced the owner's.
    assert client.get(f"/v1/trainings/{training_id}", headers=tenant).json() == kept


# -- PostgreSQL: the other writers' changes -----------------------------------------------


@pytest.fixture
def other_writer(platform: Platform) -> Iterator[Engine]:
    """A second engine on the same database: another process's writer (the monitor)."""
    if platform.engine.dialect.name != "postgresql":
        pytest.skip("SQLite keeps nothing: every read goes to the database")
    engine = make_engine(platform.engine.url.render_as_string(hide_password=False))
    yield engine
    engine.dispose()


def _record_as_monitor(engine: Engine, training_id: str, state: TrainingState) -> float:
    """Record a transition as the monitor does, in its own process's session; returns
    when (time.monotonic()) it committed."""
    with make_sessionmaker(engine)() as session:
        training = session.get(Training, training_id)
        assert training is not None
        record_transition(training, state, f"now {state}")
        session.commit()
    return time.monotonic()


def test_another_processs_change_is_seen_within_the_bound(
    client: TestClient, tenant: dict[str, str], other_writer: Engine
) -> None:
    """The monitor's transition, committed by another engine, is what the API answers as
    soon as its listener caught up past the commit (within the monitor's interval): the
    database's notification forgot the kept body."""
    views = _views(client)
    assert views is not None and views.bound == 0.25  # DLAAS_MONITOR_INTERVAL's default
    training_id = submit(client, tenant).json()["id"]
    for state in (TrainingState.PENDING, TrainingState.DOWNLOADING, TrainingState.RUNNING):
        _kept(client, tenant, training_id)
        committed = _record_as_monitor(other_writer, training_id, state)
        _until(lambda c=committed: views.caught_up_at > c, "the listener caught up")  # type: ignore[misc]
        read = client.get(f"/v1/trainings/{training_id}", headers=tenant).json()
        assert read["status"] == state
        assert read["status_history"][-1]["message"] == f"now {state}"


def test_a_lost_listener_answers_nothing_kept_until_it_is_back(
    client: TestClient, tenant: dict[str, str], platform: Platform, other_writer: Engine
) -> None:
    """The listening connection dropped (a database restart): nothing kept is answered
    while it is down, and a change made meanwhile is read once it is back."""
    views = _views(client)
    assert views is not None
    training_id = submit(client, tenant).json()["id"]
    _kept(client, tenant, training_id)
    with platform.engine.connect() as conn:
        dropped = conn.execute(
            text(
                "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity "
                "WHERE datname = current_database() AND application_name = :name"
            ),
            {"name": APPLICATION_NAME},
        ).scalar_one()
    assert dropped == 1
    _until(lambda: views.caught_up_at == float("-inf"), "the loss is noticed")
    committed = _record_as_monitor(other_writer, training_id, TrainingState.PENDING)
    _until(lambda: views.caught_up_at > committed, "the listener is back")
    assert client.get(f"/v1/trainings/{training_id}", headers=tenant).json()["status"] == (
        "PENDING"
    )


@pytest.mark.integration
def test_a_database_without_the_triggers_is_never_caught_up() -> None:
    """An API process on a database not migrated to 0006 hears nothing of the other
    writers: it must answer nothing from what it kept (every read is a query)."""
    with _fresh_database() as engine:
        upgrade(engine, "0005")
        assert _first_report(engine) == "lost"
        upgrade(engine)
        assert _first_report(engine) == "caught up"


@contextmanager
def _fresh_database() -> Iterator[Engine]:
    """An empty PostgreSQL database of this test's own, dropped after it."""
    name = f"dlaas_views_{os.getpid()}"
    admin = PG_SERVER.replace("postgresql+psycopg", "postgresql") + "/postgres"
    with psycopg.connect(admin, autocommit=True) as conn:
        conn.execute(f'DROP DATABASE IF EXISTS "{name}"')
        conn.execute(f'CREATE DATABASE "{name}"')
    engine = make_engine(f"{PG_SERVER}/{name}")
    try:
        yield engine
    finally:
        engine.dispose()
        with psycopg.connect(admin, autocommit=True) as conn:
            conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


def _first_report(engine: Engine) -> str:
    """What a listener on `engine`'s database reports first: caught up, or lost."""
    reports: list[str] = []
    heard = threading.Event()

    def report(what: str) -> None:
        reports.append(what)
        heard.set()

    changes = TrainingChanges(
        engine.url,
        changed=lambda _: None,
        caught_up=lambda _at: report("caught up"),
        lost=lambda: report("lost"),
        every=0.25,
    )
    try:
        assert heard.wait(30)
    finally:
        changes.close()
    return reports[0]


@pytest.mark.integration
def test_the_listener_hears_within_its_waits_and_closes_at_once() -> None:
    """However long the interval between its round trips (DLAAS_MONITOR_INTERVAL; 60 s
    made an API process take 30 s to shut down), the listener hands on a notification as
    it arrives and `close` returns within CLOSE_CHECK_SECONDS."""
    with _fresh_database() as engine:
        upgrade(engine)
        heard: list[str] = []
        caught_up = threading.Event()
        changes = TrainingChanges(
            engine.url,
            changed=heard.append,
            caught_up=lambda _at: caught_up.set(),
            lost=lambda: None,
            every=60.0,
        )
        try:
            assert caught_up.wait(30)
            with engine.begin() as conn:
                notify = text("SELECT pg_notify(:channel, 't-42')")
                conn.execute(notify, {"channel": TRAINING_CHANNEL})
            _until(lambda: heard == ["t-42"], "the notification is handed on", timeout=5)
        finally:
            started = time.monotonic()
            changes.close()
            took = time.monotonic() - started
        assert not changes._thread.is_alive()
        assert took < 5, f"close took {took:.1f} s"  # 30 s before; CLOSE_CHECK_SECONDS now
