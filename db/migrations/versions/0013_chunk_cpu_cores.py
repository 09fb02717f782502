"""chunks.cpu_cores: the cores the worker that ran a chunk's model held

A chunk's CPU seconds are priced per core held (LANEWAY_CPU_PRICE is a core-second's, as
`laneway plan` prices provisioned cores): a worker with two torch threads pays two
core-seconds a second, each of two one-thread workers sharing those cores one. Rows written
before have none: they count one core a second, as they were priced.

Revision ID: 0013
Revises: 0012
Create Date: 2026-11-30 03:00:00.000000
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0013"
down_revision: str | None = "0012"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.add_column("chunks", sa.Column("cpu_cores", sa.Integer(), nullable=True))


def downgrade() -> None:
    op.drop_column("chunks", "cpu_cores")
