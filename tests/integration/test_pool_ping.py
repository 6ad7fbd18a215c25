"""The PostgreSQL pool pings a connection only when it sat idle for more than
IDLE_PING_SECONDS (service/db/session.py), instead of before every use: a connection the
server dropped while it was idle is replaced before a request uses it."""

from __future__ import annotations

import time

import psycopg
import pytest
from sqlalchemy import exc as sa_exc
from sqlalchemy import text

from service.db import session as db_session
from service.db.session import make_engine
from tests.conftest import PG_SERVER


def _backend_pid(engine: object) -> int:
    with engine.connect() as conn:  # type: ignore[attr-defined]
        return int(conn.execute(text("SELECT pg_backend_pid()")).scalar_one())


def _terminate(pid: int) -> None:
    admin = PG_SERVER.replace("postgresql+psycopg", "postgresql") + "/postgres"
    with psycopg.connect(admin, autocommit=True) as conn:
        conn.execute("SELECT pg_terminate_backend(%s)", (pid,))


def test_only_an_idle_connection_is_pinged_and_a_dead_one_replaced(
    postgres_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(db_session, "IDLE_PING_SECONDS", 0.3)
    engine = make_engine(postgres_url)
    try:
        engine.pool.dispose()
        first = _backend_pid(engine)
        # Used again at once: not pinged, so a server-side end shows in the query.
        _terminate(first)
        with pytest.raises(sa_exc.OperationalError), engine.connect() as conn:
            conn.execute(text("SELECT 1"))
        second = _backend_pid(engine)  # the pool opened another in its place
        assert second != first
        # Idle past the limit: pinged, found dead, replaced before the query runs.
        _terminate(second)
        time.sleep(0.5)
        third = _backend_pid(engine)
        assert third not in (first, second)
    finally:
        engine.dispose()
