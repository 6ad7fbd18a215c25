"""The database itself: the readiness round trip and the monitor's leader lock."""

from __future__ import annotations

from sqlalchemy import Connection, text


def ping(conn: Connection) -> None:
    """A round trip to the database (readiness); raises SQLAlchemyError if it fails."""
    conn.execute(text("SELECT 1"))


def try_advisory_lock(conn: Connection, lock_id: int) -> bool:
    """Take PostgreSQL's session-level advisory lock `lock_id` if no other session holds
    it; held until the connection closes."""
    got = conn.execute(text("SELECT pg_try_advisory_lock(:id)"), {"id": lock_id}).scalar()
    conn.commit()
    return bool(got)
