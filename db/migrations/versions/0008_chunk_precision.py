"""chunk precision and runtime: the number format and runtime its model stage ran with

e.g. precision "bf16", runtime "torch 2.13.0 bf16 cpu" (inference/precision.py); the job
document sums them up per job.

Revision ID: 0008
Revises: 0007
Create Date: 2026-11-24 23:30:00.000000
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0008"
down_revision: str | None = "0007"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    with op.batch_alter_table("chunks") as batch:
        batch.add_column(sa.Column("precision", sa.String(length=20), nullable=True))
        batch.add_column(sa.Column("runtime", sa.String(length=100), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("chunks") as batch:
        batch.drop_column("runtime")
        batch.drop_column("precision")
