"""Poison items against the real Postgres and Redis: a chunk that fails through its retries
is split until the failing items stand alone; they, and only they, are dead-lettered, and
sending them back re-runs exactly them. Chunk tasks run in this process (`Task.apply`)."""

from __future__ import annotations

import uuid

import pytest
from sqlalchemy import func, select

from core.vocab import POISON_MARKER
from db.common import chunk_items
from db.models import Chunk, DeadLetter, Job, JobEvent, Result
from db.session import session_scope
from jobs.lifecycle import retry_dead_letters
from tasks.chunks import run_chunk
from tests.factories import stored_job

TEXTS = [
    "my parcel is three days late",
    f"refund me {POISON_MARKER} now",
    "the app crashes on start",
    "great support, thanks",
    f"{POISON_MARKER} billing problem",
    "cannot log in to my account",
]


@pytest.fixture
def faults(settings, worker_app):
    """Chunk tasks read the settings of the app they run in: one with the poison fault on
    (`set_faults(None)` builds one with it off again)."""

    def set_faults(value: str | None) -> None:
        worker_app(settings.replace(faults=(value,) if value else ()))

    set_faults("poison")
    return set_faults


def make_job(settings, texts) -> tuple[uuid.UUID, list[int]]:
    return stored_job(settings, texts, account_type="trial", prefix="p")


def results(settings, job_id) -> dict[str, Result]:
    with session_scope(settings) as session:
        rows = session.scalars(select(Result).where(Result.job_id == job_id)).all()
        session.expunge_all()
        return {r.item_id: r for r in rows}


def test_poison_items_fail_alone_and_the_rest_of_the_chunk_succeeds(settings, migrated, faults):
    job_id, (chunk_id,) = make_job(settings, TEXTS)
    outcome = run_chunk.apply(args=(chunk_id,)).get()  # eager: its retries run inline
    assert outcome == {"chunk": chunk_id, "items": 6, "failed": 2}
    got = results(settings, job_id)
    assert len(got) == 6
    assert {i for i, r in got.items() if r.error} == {"p1", "p4"}
    assert all("PoisonError" in got[i].error for i in ("p1", "p4"))
    assert all(got[i].label and not got[i].error for i in ("p0", "p2", "p3", "p5"))
    with session_scope(settings) as session:
        letters = session.scalars(select(DeadLetter).where(DeadLetter.job_id == job_id)).all()
        assert sorted(x.item_ids[0] for x in letters) == ["p1", "p4"]
        assert all(x.kind == "item" and "PoisonError" in x.traceback for x in letters)
        # The first run plus LANEWAY_CHUNK_RETRIES retries, then the split.
        assert all(x.attempts == settings.chunk_retries + 1 for x in letters)
        chunk = session.get(Chunk, chunk_id)
        assert chunk.state == "done" and "PoisonError" in chunk.last_error
        job = session.get(Job, job_id)
        assert (job.status, job.succeeded_items, job.failed_items) == ("partial", 4, 2)


def test_dead_letters_sent_back_rerun_exactly_their_items(settings, migrated, faults):
    job_id, (chunk_id,) = make_job(settings, TEXTS)
    run_chunk.apply(args=(chunk_id,)).get()
    before = results(settings, job_id)
    faults(None)  # the cause is gone (a fixed model, say): send the letters back
    retried = retry_dead_letters(job_id=job_id, settings=settings)
    assert (retried.letters, retried.jobs) == (2, {str(job_id): 2})
    assert retry_dead_letters(job_id=job_id, settings=settings).letters == 0  # once only
    with session_scope(settings) as session:
        job = session.get(Job, job_id)
        assert job.status == "running" and job.finished_at is None
        retry = session.scalars(
            select(Chunk).where(Chunk.job_id == job_id, Chunk.positions.is_not(None))
        ).one()
        # The retry chunk names exactly the two poisoned items (by their positions).
        assert sorted(i.item_id for i in chunk_items(session, retry)) == ["p1", "p4"]
        retry_id = retry.id
    assert run_chunk.apply(args=(retry_id,)).get()["failed"] == 0
    after = results(settings, job_id)
    assert all(not r.error for r in after.values()) and len(after) == 6
    assert {i: after[i].output for i in ("p0", "p2")} == {i: before[i].output for i in ("p0", "p2")}
    with session_scope(settings) as session:
        assert session.get(Job, job_id).status == "succeeded"
        kinds = session.scalars(
            select(JobEvent.kind).where(JobEvent.job_id == job_id).order_by(JobEvent.id)
        ).all()
        assert kinds == ["finalized", "retried", "finalized"]
        assert (
            session.scalar(
                select(func.count()).where(
                    DeadLetter.job_id == job_id, DeadLetter.retried_at.is_not(None)
                )
            )
            == 2
        )


def test_a_chunk_failing_whole_is_one_dead_letter(settings, migrated, faults):
    job_id, (chunk_id,) = make_job(settings, [f"{POISON_MARKER} {t}" for t in TEXTS[:3]])
    run_chunk.apply(args=(chunk_id,)).get()
    with session_scope(settings) as session:
        letter = session.scalars(select(DeadLetter).where(DeadLetter.job_id == job_id)).one()
        assert letter.kind == "chunk" and sorted(letter.item_ids) == ["p0", "p1", "p2"]
        assert session.get(Chunk, chunk_id).state == "failed"
        assert session.get(Job, job_id).status == "failed"


def test_without_the_fault_setting_the_marker_means_nothing(settings, migrated, faults):
    faults(None)
    job_id, (chunk_id,) = make_job(settings, TEXTS)
    assert run_chunk.apply(args=(chunk_id,)).get()["failed"] == 0
    with session_scope(settings) as session:
        assert session.get(Job, job_id).status == "succeeded"
