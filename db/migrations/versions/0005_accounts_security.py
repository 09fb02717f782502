"""accounts security: admin accounts, named API keys

Accounts get an `is_admin` flag (admins manage accounts and keys through /v1/admin);
API keys get an optional name, so an account with several keys can tell them apart.

Revision ID: 0005
Revises: 0004
Create Date: 2026-11-23 09:00:00.000000
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0005"
down_revision: str | None = "0004"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


# Plain ALTER TABLE, never batch mode: on SQLite a batch copies and drops the table, and
# dropping `accounts` with foreign keys on would cascade-delete every job.
# (SQLite 3.35+ drops columns in place.)


def upgrade() -> None:
    op.add_column(
        "accounts", sa.Column("is_admin", sa.Boolean(), server_default=sa.false(), nullable=False)
    )
    op.add_column("api_keys", sa.Column("name", sa.String(length=100), nullable=True))


def downgrade() -> None:
    op.drop_column("api_keys", "name")
    op.drop_column("accounts", "is_admin")
