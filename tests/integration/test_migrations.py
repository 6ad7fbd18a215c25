"""The migrations build the schema the models describe, from empty, on both databases."""

from __future__ import annotations

import logging
import os
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest
from alembic.autogenerate import compare_metadata
from alembic.migration import MigrationContext
from sqlalchemy import inspect

from service.db.models import Base
from service.db.session import make_engine, upgrade
from tests.conftest import PG_SERVER


@pytest.fixture(params=["sqlite", pytest.param("postgresql", marks=pytest.mark.integration)])
def empty_database(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str]:
    if request.param == "sqlite":
        yield f"sqlite:///{tmp_path / 'empty.db'}"
        return
    name = f"dlaas_migrate_{os.getpid()}"
    admin = PG_SERVER.replace("postgresql+psycopg", "postgresql") + "/postgres"
    with psycopg.connect(admin, autocommit=True) as conn:
        conn.execute(f'DROP DATABASE IF EXISTS "{name}"')
        conn.execute(f'CREATE DATABASE "{name}"')
    yield f"{PG_SERVER}/{name}"
    with psycopg.connect(admin, autocommit=True) as conn:
        conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


def test_migrations_build_the_models_schema(empty_database: str) -> None:
    engine = make_engine(empty_database)
    try:
        assert inspect(engine).get_table_names() == []
        upgrade(engine)
        upgrade(engine)  # idempotent: a second API replica starting finds nothing to do
        tables = set(inspect(engine).get_table_names())
        assert {"tenants", "api_keys", "trainings", "learners", "status_events"} <= tables
        with engine.connect() as conn:
            diff = compare_metadata(
                MigrationContext.configure(conn, opts={"compare_type": True}), Base.metadata
            )
        assert diff == [], f"models and migrations disagree: {diff}"
        index_names = {ix["name"] for ix in inspect(engine).get_indexes("trainings")}
        assert "ix_trainings_tenant_created" in index_names
    finally:
        engine.dispose()


def test_an_upgrade_logs_one_line(empty_database: str, caplog: pytest.LogCaptureFixture) -> None:
    # `dlaas up` opens with what the schema is, in one line, not Alembic's steps.
    engine = make_engine(empty_database)
    try:
        with caplog.at_level(logging.INFO):
            upgrade(engine)
        assert [r.getMessage() for r in caplog.records] == [
            f"database schema: created (revision {_head()})"
        ]
        caplog.clear()
        with caplog.at_level(logging.INFO):
            upgrade(engine)
        assert [r.getMessage() for r in caplog.records] == [
            f"database schema: up to date (revision {_head()})"
        ]
    finally:
        engine.dispose()


def _head() -> str:
    from alembic.script import ScriptDirectory

    from service.db.session import MIGRATIONS_DIR

    head = ScriptDirectory(str(MIGRATIONS_DIR)).get_current_head()
    assert head is not None
    return head
