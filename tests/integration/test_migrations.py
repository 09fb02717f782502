"""Alembic: one head, no drift between models and migrations, upgrade of empty databases."""

import json
import uuid

from alembic import command
from alembic.script import ScriptDirectory
from sqlalchemy import create_engine, inspect

from db.migrate import alembic_config, upgrade
from db.models import Base
from tests.conftest import create_database, drop_database


def test_exactly_one_head():
    heads = ScriptDirectory.from_config(alembic_config(url="sqlite://")).get_heads()
    assert len(heads) == 1


def test_upgrade_empty_postgres_then_no_drift():
    name = f"laneway_mig_{uuid.uuid4().hex[:8]}"
    url = create_database(name)
    try:
        upgrade(url=url)
        engine = create_engine(url)
        try:
            tables = set(inspect(engine).get_table_names())
        finally:
            engine.dispose()
        assert set(Base.metadata.tables) <= tables
        command.check(alembic_config(url=url))  # raises if models and migrations differ
    finally:
        drop_database(name)


def test_upgrade_empty_sqlite_then_no_drift(tmp_path):
    url = f"sqlite:///{tmp_path / 'fresh.db'}"
    upgrade(url=url)
    command.check(alembic_config(url=url))


def test_upgrade_keeps_existing_jobs_and_downgrades(tmp_path):
    """0001 -> head turns a job's `task` into `tasks`; head -> 0001 -> head round-trips."""
    from sqlalchemy import text

    url = f"sqlite:///{tmp_path / 'old.db'}"
    upgrade(url=url, revision="0001")
    engine = create_engine(url)
    job_id = uuid.uuid4().hex
    try:
        with engine.begin() as conn:
            conn.execute(text("INSERT INTO accounts (name, type) VALUES ('old', 'standard')"))
            conn.execute(
                text(
                    "INSERT INTO jobs (id, account_id, task, labels, status, lane, source, "
                    "total_items, succeeded_items, failed_items, chunk_size, model_seconds) "
                    "VALUES (:id, 1, 'classify', '[]', 'succeeded', 'cpu', 'api', 1, 1, 0, 1, 0.5)"
                ),
                {"id": job_id},
            )
            conn.execute(
                text(
                    "INSERT INTO job_items (job_id, idx, item_id, text) VALUES (:id, 0, 'a', 'x')"
                ),
                {"id": job_id},
            )
            conn.execute(
                text(
                    "INSERT INTO chunks (job_id, seq, start, stop, queue, task_id, state, "
                    "attempts) VALUES (:id, 0, 0, 1, 'cpu', 't', 'done', 1)"
                ),
                {"id": job_id},
            )
        upgrade(url=url)
        with engine.connect() as conn:
            tasks, pre = conn.execute(text("SELECT tasks, pre_seconds FROM jobs")).one()
            # SQLite rebuilds altered tables: the job's items and chunks must survive it.
            assert conn.execute(text("SELECT count(*) FROM job_items")).scalar() == 1
            assert conn.execute(text("SELECT count(*) FROM chunks")).scalar() == 1
            item = conn.execute(text("SELECT idx, pos, item_id FROM job_items")).one()
        assert tasks == '["classify"]' and pre == 0
        assert tuple(item) == (0, 0, "a")  # copying tables never cascades into their rows
        command.downgrade(alembic_config(url=url), "0001")
        with engine.connect() as conn:
            assert conn.execute(text("SELECT task FROM jobs")).scalar() == "classify"
            assert conn.execute(text("SELECT item_id FROM job_items")).scalar() == "a"
        upgrade(url=url)
        command.check(alembic_config(url=url))
    finally:
        engine.dispose()


def test_accounts_security_keeps_accounts_keys_and_jobs(tmp_path):
    """0002 -> head adds is_admin (false) and key names in place: SQLite must not copy and
    drop `accounts`, which would cascade-delete every job; head -> 0002 round-trips."""
    from sqlalchemy import text

    url = f"sqlite:///{tmp_path / 'keys.db'}"
    upgrade(url=url, revision="0002")
    engine = create_engine(url)
    rows = "SELECT (SELECT count(*) FROM jobs), (SELECT count(*) FROM api_keys)"
    try:
        with engine.begin() as conn:
            conn.execute(text("PRAGMA foreign_keys=ON"))
            conn.execute(text("INSERT INTO accounts (name, type) VALUES ('old', 'standard')"))
            conn.execute(
                text(
                    "INSERT INTO api_keys (account_id, prefix, key_hash) "
                    "VALUES (1, 'lw_00000000', 'h')"
                )
            )
            conn.execute(
                text(
                    "INSERT INTO jobs (id, account_id, tasks, labels, status, lane, source, "
                    "total_items, succeeded_items, failed_items, chunk_size, pre_seconds, "
                    "model_seconds, post_seconds) VALUES (:id, 1, '[\"classify\"]', '[]', "
                    "'queued', 'cpu', 'api', 1, 0, 0, 1, 0, 0, 0)"
                ),
                {"id": uuid.uuid4().hex},
            )
        upgrade(url=url)
        with engine.connect() as conn:
            assert conn.execute(text(rows)).one() == (1, 1)
            assert conn.execute(text("SELECT is_admin FROM accounts")).scalar() == 0
            assert conn.execute(text("SELECT name FROM api_keys")).scalar() is None
        command.downgrade(alembic_config(url=url), "0002")
        with engine.connect() as conn:
            assert conn.execute(text(rows)).one() == (1, 1)
        upgrade(url=url)
        command.check(alembic_config(url=url))
    finally:
        engine.dispose()


def embed_job(session, n: int, chunk_size: int) -> uuid.UUID:
    """An embed job of `n` items, its account written as 0008 knew accounts (the model
    has columns added since)."""
    from sqlalchemy import text

    from db.intake import create_job
    from jobs.planner import plan_chunks

    account = session.scalar(
        text("INSERT INTO accounts (name, type) VALUES (:name, 'standard') RETURNING id"),
        {"name": f"mig-{uuid.uuid4().hex[:8]}"},
    )
    return create_job(
        session,
        account_id=account,
        tasks=["embed"],
        labels=[],
        items=[(f"i{i}", "a") for i in range(n)],
        lane="cpu",
        chunks=plan_chunks(n, chunk_size),
        chunk_size=chunk_size,
    ).id


def test_results_are_compressed_with_lz4_and_stay_readable_across_the_change():
    """0009 switches results.output to lz4 where the server has it; rows written before
    (pglz) and after read back alike, and the downgrade returns to the server default."""
    from sqlalchemy import text
    from sqlalchemy.orm import Session

    name = f"laneway_mig_{uuid.uuid4().hex[:8]}"
    url = create_database(name)
    compression = text(
        "SELECT attcompression FROM pg_attribute "
        "WHERE attrelid = 'results'::regclass AND attname = 'output'"
    )
    row = "INSERT INTO results (job_id, idx, item_id, output) VALUES (:job, :idx, 'i', :out)"
    vector = {"embedding": [round(0.001 * i - 0.19, 6) for i in range(384)]}  # over 2 kB
    engine = create_engine(url)
    try:
        upgrade(url=url, revision="0008")
        with engine.begin() as conn:
            has_lz4 = conn.scalar(
                text(
                    "SELECT 'lz4' = ANY(enumvals) FROM pg_settings "
                    "WHERE name = 'default_toast_compression'"
                )
            )
        with Session(engine) as session, session.begin():
            job = embed_job(session, 2, 2)
        with engine.begin() as conn:
            conn.execute(text(row), {"job": job, "idx": 0, "out": json.dumps(vector)})
        upgrade(url=url)
        with engine.begin() as conn:
            assert conn.scalar(compression) == ("l" if has_lz4 else "")
            conn.execute(text(row), {"job": job, "idx": 1, "out": json.dumps(vector)})
            outputs = conn.scalars(text("SELECT output::text FROM results ORDER BY idx")).all()
            methods = conn.scalars(
                text("SELECT pg_column_compression(output) FROM results ORDER BY idx")
            ).all()
        assert [json.loads(o) for o in outputs] == [vector, vector]
        assert methods == (["pglz", "lz4"] if has_lz4 else ["pglz", "pglz"])
        command.downgrade(alembic_config(url=url), "0008")
        with engine.begin() as conn:
            assert conn.scalar(compression) == ""
    finally:
        engine.dispose()
        drop_database(name)


def test_result_vectors_go_back_into_the_output_on_downgrade():
    """0012 keeps an embedding as float32 bytes beside the output; its downgrade puts every
    vector back into the output's JSON (over more than one page), so no result loses it."""
    from sqlalchemy import text
    from sqlalchemy.orm import Session

    from db.results import upsert_results

    name = f"laneway_mig_{uuid.uuid4().hex[:8]}"
    url = create_database(name)
    engine = create_engine(url)
    n = 1203  # past the downgrade's page of 1,000
    vector = [round(0.001 * i - 0.19, 6) for i in range(384)]
    try:
        upgrade(url=url)
        with Session(engine) as session, session.begin():
            job = embed_job(session, n, 256)
            rows = [
                {"idx": i, "item_id": f"i{i}", "label": None,
                 "output": {"embedding": vector, "tokens": i}, "error": None}
                for i in range(n)
            ]  # fmt: skip
            upsert_results(session, job, rows)
        with engine.begin() as conn:
            assert conn.scalar(text("SELECT count(*) FROM results WHERE vector IS NULL")) == 0
        command.downgrade(alembic_config(url=url), "0011")
        with engine.begin() as conn:
            outputs = conn.scalars(text("SELECT output::text FROM results ORDER BY idx")).all()
        assert [json.loads(o) for o in outputs] == [
            {"tokens": i, "embedding": vector} for i in range(n)
        ]
        upgrade(url=url)
    finally:
        engine.dispose()
        drop_database(name)
