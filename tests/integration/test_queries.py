"""Job rows, COPY of items, idempotent result upserts and single finalization, on Postgres."""

import uuid

from sqlalchemy import func, select

from db.accounts import (
    account_for_key,
    add_api_key,
    create_account,
    find_key,
    key_prefix,
    list_keys,
    revoke_key,
    rotate_key,
)
from db.common import chunk_items, chunks_of
from db.intake import create_job
from db.models import Account, Chunk, JobItem, Result
from db.results import finalize_job, upsert_results
from jobs.planner import plan_chunks


def _job(session, n=10, size=4):
    account, _ = create_account(session, f"acme-{uuid.uuid4().hex[:8]}", "enterprise")
    items = [(f"id-{i}", f"text {i}") for i in range(n)]
    job = create_job(
        session,
        account_id=account.id,
        tasks=["classify"],
        labels=["a", "b"],
        items=items,
        lane="gpu",
        chunks=plan_chunks(n, size),
        chunk_size=size,
    )
    return job


def _end_chunks(session, job) -> None:
    for chunk in session.scalars(select(Chunk).where(Chunk.job_id == job.id)):
        chunk.state = "done"


def test_keys_are_stored_hashed_and_checked(db_session):
    account, key = create_account(db_session, "keys", "trial")
    _, second = add_api_key(db_session, account)
    assert account_for_key(db_session, key).id == account.id
    assert account_for_key(db_session, second).id == account.id
    assert account_for_key(db_session, key[:-1] + ("x" if key[-1] != "x" else "y")) is None
    assert account_for_key(db_session, "nonsense") is None
    stored = [k.key_hash for k in db_session.get(Account, account.id).keys]
    assert key not in stored and all(len(h) == 64 for h in stored)


def test_revoke_and_rotate_with_and_without_grace(db_session):
    account, first = create_account(db_session, f"rot-{uuid.uuid4().hex[:8]}", "standard")
    row = find_key(db_session, key_prefix(first))
    row.name = "nightly"
    new_row, second = rotate_key(db_session, row, grace_seconds=3600)
    # Within the grace period both keys work; the new one keeps the old one's name.
    assert account_for_key(db_session, first).id == account_for_key(db_session, second).id
    assert new_row.name == "nightly" and new_row.prefix != row.prefix
    assert new_row.prefix == key_prefix(second) and len(new_row.prefix) == 15
    # Revoking now overrides the grace period; a later grace never revives a revoked key.
    revoke_key(db_session, row)
    assert account_for_key(db_session, first) is None
    revoke_key(db_session, row, grace_seconds=3600)
    assert account_for_key(db_session, first) is None
    assert account_for_key(db_session, second).id == account.id
    assert [k.prefix for k in list_keys(db_session, account.id)] == [row.prefix, new_row.prefix]


def test_key_prefix_rejects_malformed_keys():
    assert key_prefix("lw_0123456789ab_se_cr_et") == "lw_0123456789ab"
    for bad in (
        "",
        "lw_",
        "lw__x",
        "lw_abc_",
        "xx_abc_def",
        "Bearer lw_abc",
        "lw_\x00_x",
        "lw_xyz_1",
    ):
        assert key_prefix(bad) is None


def test_create_job_copies_items_and_plans_chunks(db_session):
    job = _job(db_session, n=10, size=4)
    n = db_session.scalar(select(func.count()).where(JobItem.job_id == job.id))
    assert n == 10
    chunks = chunks_of(db_session, job.id)
    assert [(c.start, c.stop, c.queue, c.state) for c in chunks] == [
        (0, 4, "gpu", "queued"),
        (4, 8, "gpu", "queued"),
        (8, 10, "gpu", "queued"),
    ]
    assert len({c.task_id for c in chunks}) == 3
    assert [i.item_id for i in chunk_items(db_session, chunks[2])] == ["id-8", "id-9"]


def test_upsert_twice_keeps_one_result_per_item(db_session):
    job = _job(db_session, n=3)
    rows = [
        {"idx": i, "item_id": f"id-{i}", "label": "a", "output": {"label": "a"}, "error": None}
        for i in range(3)
    ]
    upsert_results(db_session, job.id, rows)
    rows[1] = {**rows[1], "label": "b", "output": {"label": "b"}}
    upsert_results(db_session, job.id, rows)
    labels = db_session.scalars(
        select(Result.label).where(Result.job_id == job.id).order_by(Result.idx)
    ).all()
    assert labels == ["a", "b", "a"]


def test_finalize_counts_and_happens_once(db_session):
    job = _job(db_session, n=4)
    upsert_results(
        db_session,
        job.id,
        [
            {"idx": 0, "item_id": "id-0", "label": "a", "output": {}, "error": None},
            {"idx": 1, "item_id": "id-1", "label": "a", "output": {}, "error": None},
            {"idx": 2, "item_id": "id-2", "label": "b", "output": {}, "error": None},
            {"idx": 3, "item_id": "id-3", "label": None, "output": None, "error": "boom"},
        ],
    )
    assert finalize_job(db_session, job.id) is None  # its chunks have not ended yet
    for chunk in db_session.scalars(select(Chunk).where(Chunk.job_id == job.id)):
        chunk.model_seconds = 0.5
        chunk.state = "done"
    assert finalize_job(db_session, job.id) == "partial"
    assert finalize_job(db_session, job.id) is None  # a second callback changes nothing
    db_session.refresh(job)
    assert (job.succeeded_items, job.failed_items) == (3, 1)
    assert job.label_counts == {"a": 2, "b": 1}
    assert job.model_seconds == 0.5
    assert job.finished_at is not None


def test_missing_results_count_as_failed(db_session):
    job = _job(db_session, n=2)
    upsert_results(
        db_session,
        job.id,
        [{"idx": 0, "item_id": "id-0", "label": "a", "output": {}, "error": None}],
    )
    _end_chunks(db_session, job)
    assert finalize_job(db_session, job.id) == "partial"
    db_session.refresh(job)
    assert (job.succeeded_items, job.failed_items) == (1, 1)


def test_reconcile_finalizes_a_job_whose_callback_was_lost(settings, migrated):
    from db.models import Job
    from db.session import session_scope
    from tasks.maintenance import finalize_orphaned_jobs

    with session_scope(settings) as session:
        job = _job(session, n=3, size=2)
        job_id = job.id
        upsert_results(
            session,
            job.id,
            [
                {"idx": i, "item_id": f"id-{i}", "label": "a", "output": {}, "error": None}
                for i in range(3)
            ],
        )
        chunks = chunks_of(session, job.id)
        chunks[0].state = "done"
        chunks[1].state = "running"
    # A chunk still running: not finalized.
    assert str(job_id) not in finalize_orphaned_jobs()
    with session_scope(settings) as session:
        chunks_of(session, job_id)[1].state = "done"
    assert str(job_id) in finalize_orphaned_jobs()
    assert str(job_id) not in finalize_orphaned_jobs()  # once only
    with session_scope(settings) as session:
        assert session.get(Job, job_id).status == "succeeded"


def test_chunks_hold_items_of_similar_length(db_session):
    account, _ = create_account(db_session, f"len-{uuid.uuid4().hex[:8]}", "standard")
    texts = ["a" * n for n in (5, 1, 9, 3, 7, 2)]
    job = create_job(
        db_session,
        account_id=account.id,
        tasks=["classify"],
        labels=["a", "b"],
        items=[(f"i{k}", t) for k, t in enumerate(texts)],
        lane="cpu",
        chunks=plan_chunks(6, 3),
        chunk_size=3,
    )
    short, long = chunks_of(db_session, job.id)
    # Chunk ranges count in length order; each item keeps its input index for its result.
    assert [(i.item_id, len(i.text)) for i in chunk_items(db_session, short)] == [
        ("i1", 1),
        ("i5", 2),
        ("i3", 3),
    ]
    assert [i.idx for i in chunk_items(db_session, long)] == [0, 4, 2]


def test_jobs_without_classify_have_no_label_counts(db_session):
    account, _ = create_account(db_session, f"nolabel-{uuid.uuid4().hex[:8]}", "standard")
    job = create_job(
        db_session,
        account_id=account.id,
        tasks=["score"],
        labels=[],
        items=[("a", "x"), ("b", "y")],
        lane="cpu",
        chunks=plan_chunks(2, 2),
        chunk_size=2,
    )
    upsert_results(
        db_session,
        job.id,
        [
            {"idx": i, "item_id": k, "label": None, "output": {"rating": 0.1}, "error": None}
            for i, k in enumerate("ab")
        ],
    )
    _end_chunks(db_session, job)
    assert finalize_job(db_session, job.id) == "succeeded"
    db_session.refresh(job)
    assert job.label_counts is None and job.succeeded_items == 2
