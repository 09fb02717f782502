"""inbox: files taken from the nightly inbox, account webhooks

`inbox_files` records each file taken from the inbox: the SHA-256 of its content (unique
per account: the same content is never ingested twice), its job and where its results
went. Accounts get an optional webhook URL, told when an inbox job's results reach the
outbox. `job_items` is keyed by (job_id, pos), the order chunks read in, and loses its
(job_id, idx) key: one index less to write per item (a third of the time of a million).

Revision ID: 0006
Revises: 0005
Create Date: 2026-11-22 13:30:00.000000
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0006"
down_revision: str | None = "0005"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    with op.batch_alter_table("job_items") as batch:
        batch.drop_constraint("uq_job_items_job_id", type_="unique")
        batch.drop_constraint("pk_job_items", type_="primary")
        batch.create_primary_key("pk_job_items", ["job_id", "pos"])
    with op.batch_alter_table("accounts") as batch:
        batch.add_column(sa.Column("webhook_url", sa.String(length=2000), nullable=True))
    op.create_table(
        "inbox_files",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("account_id", sa.Integer(), nullable=False),
        sa.Column("sha256", sa.String(length=64), nullable=False),
        sa.Column("job_id", sa.Uuid(), nullable=True),
        sa.Column("name", sa.String(length=255), nullable=False),
        sa.Column("stem", sa.String(length=255), nullable=False),
        sa.Column("size", sa.BigInteger(), nullable=False),
        sa.Column(
            "created_at", sa.DateTime(timezone=True), server_default=sa.func.now(), nullable=False
        ),
        sa.Column("outbox_sent_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("outbox_written_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("notified_at", sa.DateTime(timezone=True), nullable=True),
        sa.ForeignKeyConstraint(
            ["account_id"],
            ["accounts.id"],
            name=op.f("fk_inbox_files_account_id_accounts"),
            ondelete="CASCADE",
        ),
        sa.ForeignKeyConstraint(
            ["job_id"], ["jobs.id"], name=op.f("fk_inbox_files_job_id_jobs"), ondelete="CASCADE"
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_inbox_files")),
        sa.UniqueConstraint("account_id", "sha256", name="uq_inbox_files_account_id_sha256"),
        sa.UniqueConstraint("account_id", "stem", name="uq_inbox_files_account_id_stem"),
        sa.UniqueConstraint("job_id", name=op.f("uq_inbox_files_job_id")),
    )


def downgrade() -> None:
    op.drop_table("inbox_files")
    with op.batch_alter_table("accounts") as batch:
        batch.drop_column("webhook_url")
    with op.batch_alter_table("job_items") as batch:
        batch.drop_constraint("pk_job_items", type_="primary")
        batch.create_primary_key("pk_job_items", ["job_id", "idx"])
        batch.create_unique_constraint("uq_job_items_job_id", ["job_id", "pos"])
