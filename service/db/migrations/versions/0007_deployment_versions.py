"""deployment versions: deployment_versions (numbered SavedModels of a deployment, each
its own model process) and deployment_labels (names that point at a version). Every
existing deployment becomes its version 1, in its state, served from its model_key.

Revision ID: 0007
Revises: 0006
Create Date: 2026-11-27 05:20:00.000000
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0007"
down_revision: str | None = "0006"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        "deployment_versions",
        sa.Column("deployment_id", sa.String(length=32), nullable=False),
        sa.Column("version", sa.Integer(), autoincrement=False, nullable=False),
        sa.Column("training_id", sa.String(length=32), nullable=False),
        sa.Column("source_key", sa.String(length=512), nullable=False),
        sa.Column("model_key", sa.String(length=512), nullable=False),
        sa.Column("state", sa.String(length=16), nullable=False),
        sa.Column("status_message", sa.Text(), nullable=True),
        sa.Column("signatures", sa.JSON(), nullable=True),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("updated_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("loaded_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("unloaded_at", sa.DateTime(timezone=True), nullable=True),
        sa.ForeignKeyConstraint(["deployment_id"], ["deployments.id"], ondelete="CASCADE"),
        sa.PrimaryKeyConstraint("deployment_id", "version"),
    )
    op.create_table(
        "deployment_labels",
        sa.Column("deployment_id", sa.String(length=32), nullable=False),
        sa.Column("label", sa.String(length=64), nullable=False),
        sa.Column("version", sa.Integer(), nullable=False),
        sa.Column("updated_at", sa.DateTime(timezone=True), nullable=False),
        sa.ForeignKeyConstraint(["deployment_id"], ["deployments.id"], ondelete="CASCADE"),
        sa.PrimaryKeyConstraint("deployment_id", "label"),
    )
    # Every deployment so far served one SavedModel: it is version 1, in the deployment's
    # state (DEPLOYING, READY or FAILED name a version's states too).
    op.execute(
        "INSERT INTO deployment_versions (deployment_id, version, training_id, source_key, "
        "model_key, state, status_message, signatures, created_at, updated_at, loaded_at) "
        # source_key '': the training's model/ SavedModel, where every deployment made
        # before versions came from (the scoring service reads it as keys.saved_model_prefix).
        "SELECT id, 1, training_id, '', model_key, status, "
        "CASE WHEN status = 'READY' THEN NULL ELSE status_message END, signatures, "
        "created_at, updated_at, ready_at FROM deployments"
    )


def downgrade() -> None:
    op.drop_table("deployment_labels")
    op.drop_table("deployment_versions")
