"""job_items and results without foreign keys to jobs; a trigger deletes them with their job

Both tables take a row per item in bulk (the intake's INSERT ... SELECT, each chunk's
COPY), and a foreign key checks every row: a lookup and a lock on the job's row, which
two workers writing one job's results at once turn into a MultiXact per row. Every writer
already holds the job: the intake writes the job and its items in one transaction, and a
chunk's results are written in the transaction that holds its chunk's row locked (and
chunks keep their foreign key), so the check guards nothing those paths do not. What the
keys' ON DELETE CASCADE did stays: a trigger deletes a deleted job's items and results.
On Postgres it runs per statement, after the row-level cascades (the chunks' delete waits
for a chunk that is finishing, so the results it commits are deleted too); on SQLite per
row. SQLite drops a table's triggers with it: a later migration that rebuilds `jobs` in
batch mode must create it again (tests/integration/test_job_delete.py fails otherwise).

Revision ID: 0014
Revises: 0013
Create Date: 2026-11-30 03:40:00.000000
"""

from collections.abc import Sequence

from alembic import op

revision: str = "0014"
down_revision: str | None = "0013"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

KEYS = {"job_items": "fk_job_items_job_id_jobs", "results": "fk_results_job_id_jobs"}

PG_FUNCTION = """
CREATE FUNCTION laneway_purge_job_rows() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    DELETE FROM job_items WHERE job_id IN (SELECT id FROM gone);
    DELETE FROM results WHERE job_id IN (SELECT id FROM gone);
    RETURN NULL;
END $$
"""
PG_TRIGGER = """
CREATE TRIGGER purge_job_rows AFTER DELETE ON jobs
REFERENCING OLD TABLE AS gone FOR EACH STATEMENT EXECUTE FUNCTION laneway_purge_job_rows()
"""
SQLITE_TRIGGER = """
CREATE TRIGGER purge_job_rows AFTER DELETE ON jobs FOR EACH ROW BEGIN
    DELETE FROM job_items WHERE job_id = OLD.id;
    DELETE FROM results WHERE job_id = OLD.id;
END
"""


def _postgres() -> bool:
    return op.get_bind().dialect.name == "postgresql"


def upgrade() -> None:
    for table, key in KEYS.items():
        with op.batch_alter_table(table) as batch:
            batch.drop_constraint(key, type_="foreignkey")
    if _postgres():
        op.execute(PG_FUNCTION)
        op.execute(PG_TRIGGER)
    else:
        op.execute(SQLITE_TRIGGER)


def downgrade() -> None:
    op.execute("DROP TRIGGER IF EXISTS purge_job_rows" + (" ON jobs" if _postgres() else ""))
    if _postgres():
        op.execute("DROP FUNCTION IF EXISTS laneway_purge_job_rows()")
    for table, key in KEYS.items():
        # Rows whose job is gone would refuse the key: they belong to nothing.
        op.execute(f"DELETE FROM {table} WHERE job_id NOT IN (SELECT id FROM jobs)")
        with op.batch_alter_table(table) as batch:
            batch.create_foreign_key(key, "jobs", ["job_id"], ["id"], ondelete="CASCADE")
