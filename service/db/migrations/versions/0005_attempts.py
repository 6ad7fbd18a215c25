"""attempts: trainings.attempt, trainings.past_attempts and trainings.checkpoint_bytes
(retries from checkpoints), status_events.attempt

Revision ID: 0005
Revises: 0004
Create Date: 2026-11-23 21:40:00.000000
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0005"
down_revision: str | None = "0004"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    with op.batch_alter_table("trainings", schema=None) as batch_op:
        batch_op.add_column(
            sa.Column("checkpoint_bytes", sa.BigInteger(), server_default="0", nullable=False)
        )
        batch_op.add_column(sa.Column("attempt", sa.Integer(), server_default="1", nullable=False))
        batch_op.add_column(sa.Column("past_attempts", sa.JSON(), nullable=True))
    with op.batch_alter_table("status_events", schema=None) as batch_op:
        batch_op.add_column(sa.Column("attempt", sa.Integer(), server_default="1", nullable=False))


def downgrade() -> None:
    with op.batch_alter_table("status_events", schema=None) as batch_op:
        batch_op.drop_column("attempt")
    with op.batch_alter_table("trainings", schema=None) as batch_op:
        batch_op.drop_column("past_attempts")
        batch_op.drop_column("attempt")
        batch_op.drop_column("checkpoint_bytes")
