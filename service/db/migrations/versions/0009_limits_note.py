"""limits note: trainings.limits_note, what the platform could not enforce as the compute
configuration asks on this machine (resource limits, isolation), said once on the
training instead of in its status messages

Revision ID: 0009
Revises: 0008
Create Date: 2026-11-27 05:10:00.000000
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0009"
down_revision: str | None = "0008"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    with op.batch_alter_table("trainings", schema=None) as batch_op:
        batch_op.add_column(sa.Column("limits_note", sa.Text(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("trainings", schema=None) as batch_op:
        batch_op.drop_column("limits_note")
