"""The migrations build the schema the models describe, from empty, on both databases."""

from __future__ import annotations

import logging
import os
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path

import psycopg
import pytest
from alembic.autogenerate import compare_metadata
from alembic.migration import MigrationContext
from sqlalchemy import inspect, text
from sqlalchemy.exc import IntegrityError

from service.db.models import Base
from service.db.session import make_engine, upgrade
from tests.conftest import PG_SERVER

NOW = datetime(2026, 11, 1, tzinfo=UTC)


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


def test_existing_deployments_become_their_version_1(empty_database: str) -> None:
    """0007: each deployment made before versions is its version 1, in its state, served
    from its model_key (its source: the training's model/, which '' stands for); a FAILED
    one keeps its reason."""
    engine = make_engine(empty_database)
    try:
        upgrade(engine, "0006")
        with engine.begin() as conn:
            conn.execute(
                text(
                    "INSERT INTO tenants (id, name, plan, created_at) "
                    "VALUES ('t1', 'acme', 'standard', :now)"
                ),
                {"now": NOW},
            )
            for id_, status, message, signatures, ready in (
                ("d1", "READY", "restarted", '{"signatures": {}}', NOW),
                ("d2", "FAILED", "no serving_default", None, None),
            ):
                conn.execute(
                    text(
                        "INSERT INTO deployments (id, tenant_id, training_id, name, status, "
                        "status_message, signatures, model_key, created_at, updated_at, "
                        "ready_at) VALUES (:id, 't1', 'tr1', 'n', :status, :message, "
                        ":signatures, :key, :now, :now, :ready)"
                    ),
                    {
                        "id": id_,
                        "status": status,
                        "message": message,
                        "signatures": signatures,
                        "key": f"deployments/{id_}/model/",
                        "now": NOW,
                        "ready": ready,
                    },
                )
        upgrade(engine)
        with engine.connect() as conn:
            rows = conn.execute(
                text(
                    "SELECT deployment_id, version, training_id, source_key, model_key, state, "
                    "status_message, loaded_at IS NOT NULL FROM deployment_versions "
                    "ORDER BY deployment_id"
                )
            ).all()
        assert [tuple(r) for r in rows] == [
            (
                "d1",
                1,
                "tr1",
                "",
                "deployments/d1/model/",
                "READY",
                None,
                True,
            ),
            (
                "d2",
                1,
                "tr1",
                "",
                "deployments/d2/model/",
                "FAILED",
                "no serving_default",
                False,
            ),
        ]
    finally:
        engine.dispose()


def test_deployments_sharing_a_name_are_renamed_and_names_become_unique(
    empty_database: str,
) -> None:
    """0010: of the deployments of one tenant that share a name, the oldest keeps it and
    each later one takes the first `-<n>` suffix no deployment of the tenant has (a long
    name is cut to fit the column); then the database refuses a second deployment of the
    same tenant and name."""
    engine = make_engine(empty_database)
    long = "x" * 128
    try:
        upgrade(engine, "0009")
        with engine.begin() as conn:
            for tenant in ("t1", "t2"):
                conn.execute(
                    text(
                        "INSERT INTO tenants (id, name, plan, created_at) "
                        "VALUES (:id, :id, 'standard', :now)"
                    ),
                    {"id": tenant, "now": NOW},
                )
            for minute, (id_, tenant, name) in enumerate(
                (
                    ("d1", "t1", "m"),
                    ("d2", "t1", "m"),
                    ("d3", "t1", "m-2"),
                    ("d4", "t1", "m"),
                    ("d5", "t2", "m"),
                    ("d6", "t1", long),
                    ("d7", "t1", long),
                )
            ):
                conn.execute(
                    text(
                        "INSERT INTO deployments (id, tenant_id, training_id, name, status, "
                        "model_key, created_at, updated_at) VALUES (:id, :tenant, 'tr', "
                        ":name, 'READY', 'k', :at, :at)"
                    ),
                    {
                        "id": id_,
                        "tenant": tenant,
                        "name": name,
                        "at": NOW.replace(minute=minute),
                    },
                )
        upgrade(engine)
        with engine.connect() as conn:
            rows = conn.execute(text("SELECT id, name FROM deployments ORDER BY id")).all()
        assert dict(rows) == {
            "d1": "m",
            "d2": "m-3",
            "d3": "m-2",
            "d4": "m-4",
            "d5": "m",
            "d6": long,
            "d7": "x" * 126 + "-2",
        }
        with pytest.raises(IntegrityError), engine.begin() as conn:
            conn.execute(
                text(
                    "INSERT INTO deployments (id, tenant_id, training_id, name, status, "
                    "model_key, created_at, updated_at) VALUES ('d8', 't2', 'tr', 'm', "
                    "'READY', 'k', :at, :at)"
                ),
                {"at": NOW},
            )
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
