"""results.vector: an embedding as float32 bytes beside the output

An embed result's vector moves out of `output` (JSON text) into `vector` (bytea, float32,
core/util/vectors.py): a quarter of the bytes, no JSON to encode or parse, and under
Postgres' compression threshold. Rows written before keep their vector in `output`; both
read alike.

Revision ID: 0012
Revises: 0011
Create Date: 2026-11-28 23:50:00.000000
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0012"
down_revision: str | None = "0011"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.add_column("results", sa.Column("vector", sa.LargeBinary(), nullable=True))


RESULTS = sa.table(
    "results",
    sa.column("job_id", sa.Uuid()),
    sa.column("idx", sa.Integer()),
    sa.column("output", sa.JSON()),
    sa.column("vector", sa.LargeBinary()),
)


def downgrade() -> None:
    # The vectors go back into `output` first, a page at a time: no result loses its
    # embedding, and a large table is never read whole.
    from core.util.vectors import join

    bind = op.get_bind()
    while True:
        page = bind.execute(
            sa.select(RESULTS.c.job_id, RESULTS.c.idx, RESULTS.c.output, RESULTS.c.vector)
            .where(RESULTS.c.vector.is_not(None))
            .limit(1000)
        ).all()
        if not page:
            break
        for job_id, idx, output, vector in page:
            bind.execute(
                sa.update(RESULTS)
                .where(RESULTS.c.job_id == job_id, RESULTS.c.idx == idx)
                .values(output=join(output, vector), vector=None)
            )
    op.drop_column("results", "vector")
