"""gpu lane: worker events, running tasks, idle time and cold starts per worker, routing per job

Revision ID: 0004
Revises: 0003
Create Date: 2026-11-22 13:49:07.091075
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0004"
down_revision: str | None = "0003"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

WORKER_COLUMNS = ("idle_since", "waiting_since", "first_task_at")


def upgrade() -> None:
    op.create_table(
        "worker_events",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("worker_id", sa.String(length=64), nullable=False),
        sa.Column("hostname", sa.String(length=200), nullable=False),
        sa.Column("kind", sa.String(length=20), nullable=False),
        sa.Column("reason", sa.String(length=200), nullable=True),
        sa.Column("detail", sa.JSON(), nullable=True),
        sa.Column(
            "created_at", sa.DateTime(timezone=True), server_default=sa.func.now(), nullable=False
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_worker_events")),
    )
    op.create_index("ix_worker_events_worker_id", "worker_events", ["worker_id"], unique=False)
    with op.batch_alter_table("jobs") as batch:
        batch.add_column(sa.Column("routing", sa.JSON(), nullable=True))
    with op.batch_alter_table("workers") as batch:
        batch.add_column(sa.Column("gpu_device", sa.String(length=20), nullable=True))
        batch.add_column(sa.Column("start_reason", sa.String(length=200), nullable=True))
        batch.add_column(
            sa.Column("running_tasks", sa.Integer(), nullable=False, server_default="0")
        )
        for name in WORKER_COLUMNS:
            batch.add_column(sa.Column(name, sa.DateTime(timezone=True), nullable=True))
        batch.add_column(sa.Column("cold_start_seconds", sa.Float(), nullable=True))
    with op.batch_alter_table("workers") as batch:
        batch.alter_column("running_tasks", existing_type=sa.Integer(), server_default=None)


def downgrade() -> None:
    with op.batch_alter_table("workers") as batch:
        batch.drop_column("cold_start_seconds")
        for name in reversed(WORKER_COLUMNS):
            batch.drop_column(name)
        batch.drop_column("running_tasks")
        batch.drop_column("start_reason")
        batch.drop_column("gpu_device")
    with op.batch_alter_table("jobs") as batch:
        batch.drop_column("routing")
    op.drop_index("ix_worker_events_worker_id", table_name="worker_events")
    op.drop_table("worker_events")
