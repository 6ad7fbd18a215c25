"""Engines, sessions and schema migrations."""

from __future__ import annotations

import contextlib
import logging
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from alembic import command
from alembic.config import Config
from alembic.runtime.migration import MigrationContext
from sqlalchemy import Engine, create_engine, event, text
from sqlalchemy import exc as sa_exc
from sqlalchemy.engine import URL, make_url
from sqlalchemy.orm import Session, sessionmaker

from service.private import private_file

log = logging.getLogger(__name__)

MIGRATIONS_DIR = Path(__file__).parent / "migrations"
# What SQLAlchemy raises when the database cannot be used now: the server is down or
# restarting (a refused or dropped connection), a connection was lost mid-request, or no
# pooled connection came free in time. The same work may succeed a moment later (the API
# answers 503; the worker's tasks are retried).
DATABASE_UNAVAILABLE: tuple[type[Exception], ...] = (
    sa_exc.OperationalError,
    sa_exc.InterfaceError,
    sa_exc.TimeoutError,
)
# Seconds to wait for a server connection to open: a database host that does not answer
# (down, or a dropped route) fails the request (503) instead of holding it for minutes.
CONNECT_TIMEOUT = 5
# Arbitrary constant: API replicas starting together take turns migrating (PostgreSQL).
_MIGRATION_LOCK_ID = 0x444C4141


def make_engine(url: str) -> Engine:
    parsed = make_url(url)
    if parsed.get_backend_name() == "sqlite":
        if parsed.database and parsed.database != ":memory:":
            # Created owner-only before SQLite opens it (its -wal and -shm files take the
            # database's mode); one left open by an older version is narrowed.
            private_file(Path(parsed.database))
        # No pre-ping: a file opened in this process does not go stale as a server
        # connection can, and the ping would cost as much as a query.
        # A pool as large as the API's worker threads (40): connections above pool_size
        # are closed when returned, and reopening one (schema read, pragmas) costs ten
        # times the query it was opened for.
        engine = create_engine(
            url,
            connect_args={"check_same_thread": False, "timeout": 30},
            pool_size=40,
            max_overflow=20,
        )
        event.listen(engine, "connect", _sqlite_pragmas)
        return engine
    # Pinged before use when idle (`_ping_if_idle`): a pooled connection the server closed
    # (a restart) is replaced before use, so the first request after the database comes
    # back succeeds.
    engine = create_engine(
        url,
        pool_size=10,
        max_overflow=20,
        connect_args=server_connect_args(url),
    )
    event.listen(engine, "connect", _checked_in)  # a new connection needs no ping
    event.listen(engine, "checkin", _checked_in)
    event.listen(engine, "checkout", _ping_if_idle)
    return engine


# A pooled server connection idle longer than this is pinged before it is used again.
# pool_pre_ping pinged every checkout: a round trip to the server per transaction, as long
# as the query it guards on a busy API. A connection returned within the second was in
# use then, so the server was there; one the server dropped since fails its request once
# (503, as during the outage), and the pool replaces it.
IDLE_PING_SECONDS = 1.0


def _checked_in(_dbapi_connection: Any, record: Any) -> None:
    record.info["checked_in"] = time.monotonic()


def _ping_if_idle(dbapi_connection: Any, record: Any, _proxy: Any) -> None:
    """Ping a connection idle for more than IDLE_PING_SECONDS (or never used); a dead one
    is DisconnectionError, on which the pool opens another in its place."""
    last = record.info.get("checked_in")
    if last is not None and time.monotonic() - last <= IDLE_PING_SECONDS:
        return
    try:
        cursor = dbapi_connection.cursor()
        try:
            cursor.execute("SELECT 1")
        finally:
            cursor.close()
    except Exception as e:
        raise sa_exc.DisconnectionError(f"a pooled connection is gone: {e}") from e


def server_connect_args(url: str | URL) -> dict[str, Any]:
    """The connect timeout for a server database, unless the URL sets its own."""
    if "connect_timeout" in make_url(url).query:
        return {}
    return {"connect_timeout": CONNECT_TIMEOUT}


def _sqlite_pragmas(dbapi_connection: Any, _record: Any) -> None:
    cursor = dbapi_connection.cursor()
    cursor.execute("PRAGMA foreign_keys=ON")
    cursor.execute("PRAGMA journal_mode=WAL")
    cursor.execute("PRAGMA busy_timeout=30000")
    cursor.close()


def make_sessionmaker(engine: Engine) -> sessionmaker[Session]:
    return sessionmaker(engine, expire_on_commit=False)


def alembic_config(engine: Engine) -> Config:
    cfg = Config()
    cfg.set_main_option("script_location", str(MIGRATIONS_DIR))
    cfg.attributes["engine"] = engine
    return cfg


def upgrade(engine: Engine, revision: str = "head") -> None:
    """Bring the schema to `revision`; safe to call from several processes at once.

    Alembic's own lines (its context, each step) are kept below WARNING: the upgrade says
    one line, what the schema was and is."""
    cfg = alembic_config(engine)
    if engine.dialect.name == "postgresql":
        with engine.connect() as conn:
            conn.execute(text("SELECT pg_advisory_lock(:id)"), {"id": _MIGRATION_LOCK_ID})
            try:
                cfg.attributes["connection"] = conn
                before = _revision(conn)
                with _alembic_quiet():
                    command.upgrade(cfg, revision)
                after = _revision(conn)
                conn.commit()
            finally:
                conn.execute(text("SELECT pg_advisory_unlock(:id)"), {"id": _MIGRATION_LOCK_ID})
                conn.commit()
        log.info("%s", migration_summary(before, after))
        return
    with engine.connect() as conn:
        before = _revision(conn)
    with _alembic_quiet():
        command.upgrade(cfg, revision)
    with engine.connect() as conn:
        after = _revision(conn)
    log.info("%s", migration_summary(before, after))


def migration_summary(before: str | None, after: str | None) -> str:
    """The one line an upgrade logs."""
    if before == after:
        return f"database schema: up to date (revision {after})"
    if before is None:
        return f"database schema: created (revision {after})"
    return f"database schema: migrated from revision {before} to {after}"


def _revision(conn: Any) -> str | None:
    with _alembic_quiet():
        return MigrationContext.configure(conn).get_current_revision()


@contextlib.contextmanager
def _alembic_quiet() -> Iterator[None]:
    logger = logging.getLogger("alembic")
    level = logger.level
    logger.setLevel(logging.WARNING)
    try:
        yield
    finally:
        logger.setLevel(level)
