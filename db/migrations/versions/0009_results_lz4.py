"""results.output compressed with lz4 on Postgres

A chunk of 256 embeddings is ~1 MB of JSON text; Postgres compresses each value over 2 kB
before storing it, and its default (pglz) takes several times the backend CPU of the rest of
the upsert. lz4 compresses the same rows at a fraction of the CPU, and reads decompress
either kind, so rows written before stay readable. Skipped where the server was built
without lz4 (and on SQLite).

Revision ID: 0009
Revises: 0008
Create Date: 2026-11-24 23:30:00.000000
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0009"
down_revision: str | None = "0008"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

LZ4_AVAILABLE = sa.text(
    "SELECT 'lz4' = ANY(enumvals) FROM pg_settings WHERE name = 'default_toast_compression'"
)


def _compression(method: str) -> None:
    bind = op.get_bind()
    if bind.dialect.name != "postgresql" or not bind.scalar(LZ4_AVAILABLE):
        return
    op.execute(f"ALTER TABLE results ALTER COLUMN output SET COMPRESSION {method}")


def upgrade() -> None:
    _compression("lz4")


def downgrade() -> None:
    _compression("default")  # back to the server's default_toast_compression
