"""Engines, sessions and schema migrations."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from alembic import command
from alembic.config import Config
from sqlalchemy import Engine, create_engine, event, text
from sqlalchemy.engine import make_url
from sqlalchemy.orm import Session, sessionmaker

from service.private import private_file

MIGRATIONS_DIR = Path(__file__).parent / "migrations"
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
    return create_engine(url, pool_pre_ping=True, pool_size=10, max_overflow=20)


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
    """Bring the schema to `revision`; safe to call from several processes at once."""
    cfg = alembic_config(engine)
    if engine.dialect.name == "postgresql":
        with engine.connect() as conn:
            conn.execute(text("SELECT pg_advisory_lock(:id)"), {"id": _MIGRATION_LOCK_ID})
            try:
                cfg.attributes["connection"] = conn
                command.upgrade(cfg, revision)
                conn.commit()
            finally:
                conn.execute(text("SELECT pg_advisory_unlock(:id)"), {"id": _MIGRATION_LOCK_ID})
                conn.commit()
        return
    command.upgrade(cfg, revision)
