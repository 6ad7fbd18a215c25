"""unique deployment names: (tenant_id, name) is unique in deployments, as TensorFlow
Serving's paths and the gRPC API address a model by its name. The name was checked before
the insert only, so two deployments made at once could share it; such later ones are
renamed with the first free `-<n>` suffix (the oldest keeps the name) before the index is
made.

Revision ID: 0010
Revises: 0009
Create Date: 2026-11-28 00:00:00.000000
"""

import logging
from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0010"
down_revision: str | None = "0009"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

_NAME_LENGTH = 128  # deployments.name's column
log = logging.getLogger("dlaas.db.migrations")


def _suffixed(name: str, n: int) -> str:
    suffix = f"-{n}"
    return name[: _NAME_LENGTH - len(suffix)] + suffix


def upgrade() -> None:
    conn = op.get_bind()
    rows = conn.execute(
        sa.text("SELECT id, tenant_id, name FROM deployments ORDER BY created_at, id")
    ).all()
    # Every name in use stays in use by its oldest holder; a later holder's new name is
    # free of all of them.
    taken = {(tenant_id, name) for _, tenant_id, name in rows}
    kept: set[tuple[str, str]] = set()
    renames: list[dict[str, str]] = []
    for id_, tenant_id, name in rows:
        if (tenant_id, name) not in kept:
            kept.add((tenant_id, name))
            continue
        n = 2
        while (tenant_id, _suffixed(name, n)) in taken:
            n += 1
        new = _suffixed(name, n)
        taken.add((tenant_id, new))
        renames.append({"id": id_, "name": new})
    if renames:
        conn.execute(sa.text("UPDATE deployments SET name = :name WHERE id = :id"), renames)
        log.warning("renamed %d deployment(s) that shared a name with an older one", len(renames))
    op.create_index("uq_deployments_tenant_name", "deployments", ["tenant_id", "name"], unique=True)


def downgrade() -> None:
    op.drop_index("uq_deployments_tenant_name", table_name="deployments")
