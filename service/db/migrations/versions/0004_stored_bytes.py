"""stored bytes: trainings.code_bytes and trainings.results_bytes (the plan's
max_stored_bytes counts them)

Revision ID: 0004
Revises: 0003
Create Date: 2026-11-23 19:50:00.000000
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0004"
down_revision: str | None = "0003"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    with op.batch_alter_table("trainings", schema=None) as batch_op:
        batch_op.add_column(
            sa.Column("code_bytes", sa.BigInteger(), server_default="0", nullable=False)
        )
        batch_op.add_column(
            sa.Column("results_bytes", sa.BigInteger(), server_default="0", nullable=False)
        )


def downgrade() -> None:
    with op.batch_alter_table("trainings", schema=None) as batch_op:
        batch_op.drop_column("results_bytes")
        batch_op.drop_column("code_bytes")
