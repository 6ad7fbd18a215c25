"""submitted manifests: trainings.submitted_manifest, the manifest as the user sent it (an
FfDL manifest, say, beside the platform's manifest it was translated to), credentials
masked. Trainings submitted before have none (NULL).

Revision ID: 0008
Revises: 0006
Create Date: 2026-11-27 05:10:00.000000
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0008"
down_revision: str | None = "0006"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    with op.batch_alter_table("trainings", schema=None) as batch_op:
        batch_op.add_column(sa.Column("submitted_manifest", sa.JSON(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("trainings", schema=None) as batch_op:
        batch_op.drop_column("submitted_manifest")
