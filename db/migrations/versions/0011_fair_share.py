"""fair_share: accounts share each lane by weight

`accounts.share_weight` (NULL: the account type's weight), `lane_shares` (each account's
pass on each lane, for start-time fair queuing), `lane_clocks` (each lane's clock), and a
partial index on the chunks that wait for a slot (state 'held'), which every refill of a
lane reads. Jobs held whole by the
old backpressure become queued: their chunks stay held, and fair share gives them slots.

Revision ID: 0011
Revises: 0010
Create Date: 2026-11-28 09:30:00.000000
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0011"
down_revision: str | None = "0010"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

HELD = sa.text("state = 'held'")


def upgrade() -> None:
    op.add_column("accounts", sa.Column("share_weight", sa.Float(), nullable=True))
    op.create_table(
        "lane_shares",
        sa.Column("lane", sa.String(length=10), nullable=False),
        sa.Column("account_id", sa.Integer(), nullable=False),
        sa.Column("pass", sa.Float(), nullable=False),
        sa.CheckConstraint("lane IN ('cpu', 'gpu')", name=op.f("ck_lane_shares_lane")),
        sa.ForeignKeyConstraint(
            ["account_id"],
            ["accounts.id"],
            name=op.f("fk_lane_shares_account_id_accounts"),
            ondelete="CASCADE",
        ),
        sa.PrimaryKeyConstraint("lane", "account_id", name=op.f("pk_lane_shares")),
    )
    op.create_table(
        "lane_clocks",
        sa.Column("lane", sa.String(length=10), nullable=False),
        sa.Column("clock", sa.Float(), nullable=False),
        sa.CheckConstraint("lane IN ('cpu', 'gpu')", name=op.f("ck_lane_clocks_lane")),
        sa.PrimaryKeyConstraint("lane", name=op.f("pk_lane_clocks")),
    )
    op.create_index(
        "ix_chunks_held",
        "chunks",
        ["queue", "job_id", "seq"],
        unique=False,
        postgresql_where=HELD,
        sqlite_where=HELD,
    )
    op.execute("UPDATE jobs SET status = 'queued' WHERE status = 'held'")


def downgrade() -> None:
    op.drop_index("ix_chunks_held", table_name="chunks")
    op.drop_table("lane_clocks")
    op.drop_table("lane_shares")
    with op.batch_alter_table("accounts") as batch:
        batch.drop_column("share_weight")
