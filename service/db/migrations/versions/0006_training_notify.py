"""training change notifications: on PostgreSQL, every change to a training, its learners
or its status history notifies `dlaas_training_changed` with the training's id, in the
writing transaction (delivered at its commit). API processes listen and forget the views
they keep of that training (service.api.training_views). Nothing on SQLite.

Revision ID: 0006
Revises: 0005
Create Date: 2026-11-24 03:50:00.000000
"""

from collections.abc import Sequence

from alembic import op

revision: str = "0006"
down_revision: str | None = "0005"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

# Frozen here as the migration ran; service.db.changes.TRAINING_CHANNEL names the same.
CHANNEL = "dlaas_training_changed"
# The table and the column that holds the training's id in it.
TABLES = (("trainings", "id"), ("learners", "training_id"), ("status_events", "training_id"))


def upgrade() -> None:
    if op.get_bind().dialect.name != "postgresql":
        return
    for table, column in TABLES:
        # One function per table: the column is named in its body (a row's fields cannot
        # be read by a name passed as an argument without dynamic SQL).
        op.execute(
            f"""
            CREATE OR REPLACE FUNCTION dlaas_notify_{table}() RETURNS trigger AS $$
            BEGIN
                -- Repeated (channel, payload) pairs in one transaction are sent once.
                IF TG_OP = 'DELETE' THEN
                    PERFORM pg_notify('{CHANNEL}', OLD.{column});
                ELSE
                    PERFORM pg_notify('{CHANNEL}', NEW.{column});
                END IF;
                RETURN NULL;
            END;
            $$ LANGUAGE plpgsql
            """
        )
        op.execute(
            f"""
            CREATE TRIGGER dlaas_notify_{table}
            AFTER INSERT OR UPDATE OR DELETE ON {table}
            FOR EACH ROW EXECUTE FUNCTION dlaas_notify_{table}()
            """
        )


def downgrade() -> None:
    if op.get_bind().dialect.name != "postgresql":
        return
    for table, _ in TABLES:
        op.execute(f"DROP TRIGGER IF EXISTS dlaas_notify_{table} ON {table}")
        op.execute(f"DROP FUNCTION IF EXISTS dlaas_notify_{table}()")
