"""reliability: dead letters, workers and their heartbeats, job events, held and cancelled

Chunks learn their stage, the worker process running them, an explicit item list (retry
chunks) and their parent (split chunks); jobs may be held (backpressure) or cancelling.

Revision ID: 0003
Revises: 0002
Create Date: 2026-11-22 13:11:39.291824
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0003"
down_revision: str | None = "0002"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

OLD_JOB_STATUSES = "status IN ('queued', 'running', 'succeeded', 'partial', 'failed', 'cancelled')"
JOB_STATUSES = (
    "status IN ('held', 'queued', 'running', 'cancelling', 'succeeded', 'partial', 'failed', "
    "'cancelled')"
)
OLD_CHUNK_STATES = "state IN ('queued', 'running', 'done', 'failed', 'cancelled')"
CHUNK_STATES = "state IN ('held', 'queued', 'running', 'done', 'failed', 'cancelled', 'split')"
CHUNK_STAGES = "stage IN ('run', 'prep', 'model', 'post')"


def created_at() -> sa.Column:
    return sa.Column(
        "created_at", sa.DateTime(timezone=True), server_default=sa.func.now(), nullable=False
    )


def upgrade() -> None:
    op.create_table(
        "workers",
        sa.Column("id", sa.String(length=64), nullable=False),
        sa.Column("hostname", sa.String(length=200), nullable=False),
        sa.Column("queues", sa.JSON(), nullable=False),
        sa.Column("device", sa.String(length=20), nullable=True),
        sa.Column("pid", sa.Integer(), nullable=False),
        sa.Column(
            "started_at", sa.DateTime(timezone=True), server_default=sa.func.now(), nullable=False
        ),
        sa.Column("last_seen_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("stopped_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("stop_reason", sa.String(length=200), nullable=True),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_workers")),
    )
    op.create_table(
        "job_events",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("job_id", sa.Uuid(), nullable=False),
        sa.Column("kind", sa.String(length=30), nullable=False),
        sa.Column("detail", sa.JSON(), nullable=True),
        created_at(),
        sa.ForeignKeyConstraint(
            ["job_id"], ["jobs.id"], name=op.f("fk_job_events_job_id_jobs"), ondelete="CASCADE"
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_job_events")),
    )
    op.create_index("ix_job_events_job_id", "job_events", ["job_id"], unique=False)

    with op.batch_alter_table("chunks") as batch:
        batch.add_column(sa.Column("positions", sa.JSON(), nullable=True))
        batch.add_column(sa.Column("parent_id", sa.Integer(), nullable=True))
        batch.add_column(
            sa.Column("stage", sa.String(length=10), nullable=False, server_default="run")
        )
        batch.add_column(sa.Column("worker_instance", sa.String(length=64), nullable=True))
        batch.add_column(sa.Column("last_error", sa.Text(), nullable=True))
        batch.create_foreign_key(
            batch.f("fk_chunks_parent_id_chunks"),
            "chunks",
            ["parent_id"],
            ["id"],
            ondelete="SET NULL",
        )
        batch.drop_constraint(batch.f("ck_chunks_state"), type_="check")
        batch.create_check_constraint(batch.f("ck_chunks_state"), sa.text(CHUNK_STATES))
        batch.create_check_constraint(batch.f("ck_chunks_stage"), sa.text(CHUNK_STAGES))
    # Chunks of earlier gpu-lane jobs already ran as prep -> model -> post chains.
    op.execute("UPDATE chunks SET stage = 'prep' WHERE queue = 'gpu' AND state = 'queued'")
    with op.batch_alter_table("chunks") as batch:
        batch.alter_column("stage", existing_type=sa.String(length=10), server_default=None)

    with op.batch_alter_table("jobs") as batch:
        batch.add_column(
            sa.Column("cancelled_items", sa.Integer(), nullable=False, server_default="0")
        )
        batch.add_column(sa.Column("cancel_requested_at", sa.DateTime(timezone=True)))
        batch.drop_constraint(batch.f("ck_jobs_status"), type_="check")
        batch.create_check_constraint(batch.f("ck_jobs_status"), sa.text(JOB_STATUSES))
    with op.batch_alter_table("jobs") as batch:
        batch.alter_column("cancelled_items", existing_type=sa.Integer(), server_default=None)

    op.create_table(
        "dead_letters",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("job_id", sa.Uuid(), nullable=False),
        sa.Column("chunk_id", sa.Integer(), nullable=True),
        sa.Column("kind", sa.String(length=10), nullable=False),
        sa.Column("idxs", sa.JSON(), nullable=False),
        sa.Column("item_ids", sa.JSON(), nullable=False),
        sa.Column("error", sa.Text(), nullable=False),
        sa.Column("traceback", sa.Text(), nullable=True),
        sa.Column("attempts", sa.Integer(), nullable=False),
        created_at(),
        sa.Column("retried_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("retry_chunk_id", sa.Integer(), nullable=True),
        sa.CheckConstraint("kind IN ('item', 'chunk')", name=op.f("ck_dead_letters_kind")),
        sa.ForeignKeyConstraint(
            ["chunk_id"],
            ["chunks.id"],
            name=op.f("fk_dead_letters_chunk_id_chunks"),
            ondelete="SET NULL",
        ),
        sa.ForeignKeyConstraint(
            ["job_id"], ["jobs.id"], name=op.f("fk_dead_letters_job_id_jobs"), ondelete="CASCADE"
        ),
        sa.ForeignKeyConstraint(
            ["retry_chunk_id"],
            ["chunks.id"],
            name=op.f("fk_dead_letters_retry_chunk_id_chunks"),
            ondelete="SET NULL",
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_dead_letters")),
    )
    op.create_index("ix_dead_letters_job_id", "dead_letters", ["job_id"], unique=False)


def downgrade() -> None:
    op.drop_index("ix_dead_letters_job_id", table_name="dead_letters")
    op.drop_table("dead_letters")
    op.execute("UPDATE chunks SET state = 'queued' WHERE state = 'held'")
    op.execute("UPDATE chunks SET state = 'done' WHERE state = 'split'")  # children cover it
    op.execute("UPDATE jobs SET status = 'queued' WHERE status = 'held'")
    op.execute("UPDATE jobs SET status = 'running' WHERE status = 'cancelling'")
    with op.batch_alter_table("jobs") as batch:
        batch.drop_constraint(batch.f("ck_jobs_status"), type_="check")
        batch.create_check_constraint(batch.f("ck_jobs_status"), sa.text(OLD_JOB_STATUSES))
        batch.drop_column("cancel_requested_at")
        batch.drop_column("cancelled_items")
    with op.batch_alter_table("chunks") as batch:
        batch.drop_constraint(batch.f("ck_chunks_stage"), type_="check")
        batch.drop_constraint(batch.f("ck_chunks_state"), type_="check")
        batch.create_check_constraint(batch.f("ck_chunks_state"), sa.text(OLD_CHUNK_STATES))
        batch.drop_constraint(batch.f("fk_chunks_parent_id_chunks"), type_="foreignkey")
        batch.drop_column("last_error")
        batch.drop_column("worker_instance")
        batch.drop_column("stage")
        batch.drop_column("parent_id")
        batch.drop_column("positions")
    op.drop_index("ix_job_events_job_id", table_name="job_events")
    op.drop_table("job_events")
    op.drop_table("workers")
