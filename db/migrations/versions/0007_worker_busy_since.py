"""worker busy_since: when a worker's current busy spell began

For the dashboard's "busy since": chunk workers set it when their first running chunk task
starts, the interactive worker's heartbeat from its batcher (it runs no chunk task).

Revision ID: 0007
Revises: 0006
Create Date: 2026-11-23 10:00:00.000000
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0007"
down_revision: str | None = "0006"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    with op.batch_alter_table("workers") as batch:
        batch.add_column(sa.Column("busy_since", sa.DateTime(timezone=True), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("workers") as batch:
        batch.drop_column("busy_since")
