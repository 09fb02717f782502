"""tasks, stage timings and cost

A job may ask for several tasks (classify, score, extract, embed); each chunk records the
seconds of its three stages and the device its model ran on; a job keeps its cost. Items
get a position in length order (`pos`), which chunk ranges now count in.

Revision ID: 0002
Revises: 0001
Create Date: 2026-11-22 10:37:08.504971
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0002"
down_revision: str | None = "0001"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    # Existing jobs keep their input order as their length order: their chunks still cover
    # the same items.
    with op.batch_alter_table("job_items") as batch:
        batch.add_column(sa.Column("pos", sa.Integer(), nullable=True))
    op.execute("UPDATE job_items SET pos = idx")
    with op.batch_alter_table("job_items") as batch:
        batch.alter_column("pos", existing_type=sa.Integer(), nullable=False)
        batch.create_unique_constraint(batch.f("uq_job_items_job_id"), ["job_id", "pos"])

    with op.batch_alter_table("chunks") as batch:
        batch.add_column(sa.Column("device", sa.String(length=20), nullable=True))
        batch.add_column(sa.Column("pre_seconds", sa.Float(), nullable=True))
        batch.add_column(sa.Column("post_seconds", sa.Float(), nullable=True))

    # Existing rows get values first; the columns then lose their temporary defaults.
    with op.batch_alter_table("jobs") as batch:
        batch.add_column(sa.Column("tasks", sa.JSON(), nullable=True))
        batch.add_column(sa.Column("pre_seconds", sa.Float(), nullable=False, server_default="0"))
        batch.add_column(sa.Column("post_seconds", sa.Float(), nullable=False, server_default="0"))
        batch.add_column(sa.Column("cost", sa.JSON(), nullable=True))
    jobs = sa.table("jobs", sa.column("task", sa.String), sa.column("tasks", sa.JSON))
    conn = op.get_bind()
    for (task,) in conn.execute(sa.select(jobs.c.task).distinct()).all():
        conn.execute(jobs.update().where(jobs.c.task == task).values(tasks=[task]))
    with op.batch_alter_table("jobs") as batch:
        batch.alter_column("tasks", existing_type=sa.JSON(), nullable=False)
        batch.alter_column("pre_seconds", existing_type=sa.Float(), server_default=None)
        batch.alter_column("post_seconds", existing_type=sa.Float(), server_default=None)
        batch.drop_column("task")


def downgrade() -> None:
    with op.batch_alter_table("jobs") as batch:
        batch.add_column(sa.Column("task", sa.String(length=40), nullable=True))
    jobs = sa.table(
        "jobs", sa.column("id", sa.Uuid), sa.column("task"), sa.column("tasks", sa.JSON)
    )
    conn = op.get_bind()
    for job_id, tasks in conn.execute(sa.select(jobs.c.id, jobs.c.tasks)).all():
        conn.execute(jobs.update().where(jobs.c.id == job_id).values(task=tasks[0]))
    with op.batch_alter_table("jobs") as batch:
        batch.alter_column("task", existing_type=sa.String(length=40), nullable=False)
        batch.drop_column("cost")
        batch.drop_column("post_seconds")
        batch.drop_column("pre_seconds")
        batch.drop_column("tasks")
    with op.batch_alter_table("job_items") as batch:
        batch.drop_constraint(batch.f("uq_job_items_job_id"), type_="unique")
        batch.drop_column("pos")
    with op.batch_alter_table("chunks") as batch:
        batch.drop_column("post_seconds")
        batch.drop_column("pre_seconds")
        batch.drop_column("device")
