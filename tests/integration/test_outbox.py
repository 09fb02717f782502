"""The outbox and the webhook against the real Postgres, Redis and a real HTTP receiver
(results are written here as a worker would, without running the model)."""

from __future__ import annotations

import base64
import csv
import gzip
import io
import json
import os
import uuid
from datetime import timedelta

import pytest
import redis
from sqlalchemy import update

from core.config.settings import Settings
from core.util.safefs import Refused
from core.util.webhooks import WebhookError
from db.common import utcnow
from db.models import Chunk, InboxFile
from db.results import finalize_job, upsert_results
from db.session import session_scope
from jobs.inbox import scan_inbox
from jobs.outbox import notify_webhook, resend_lost_outbox, send_outbox, write_outbox
from tasks.inbox import write_outbox_task
from tests.receiver import Receiver


@pytest.fixture
def s(tmp_path, migrated) -> Settings:
    return Settings.from_env(
        {
            **os.environ,
            "LANEWAY_INBOX_DIR": str(tmp_path / "inbox"),
            "LANEWAY_OUTBOX_DIR": str(tmp_path / "outbox"),
            "LANEWAY_INBOX_SETTLE": "0",
        }
    )


def ingest(s: Settings, account, name: str, data: bytes) -> uuid.UUID:
    folder = s.inbox_dir / account.name
    folder.mkdir(parents=True, exist_ok=True)
    (folder / name).write_bytes(data)
    (outcome,) = scan_inbox(s)
    assert outcome.status == "ingested", outcome
    return uuid.UUID(outcome.job_id)


def finish(job_id: uuid.UUID, n: int, failed: set[int] = frozenset()) -> None:
    """Results and chunk states as the chunks would write them, then the finalization."""
    rows = [
        {"idx": i, "item_id": f"r{i}", "label": None, "output": None, "error": "model failed"}
        if i in failed
        else {
            "idx": i,
            "item_id": f"r{i}",
            "label": "billing" if i % 2 else "praise",
            "output": {
                "label": "billing" if i % 2 else "praise",
                "score": 0.5,
                "scores": {"billing": 0.5, "praise": 0.5},
            },
            "error": None,
        }
        for i in range(n)
    ]
    with session_scope() as session:
        upsert_results(session, job_id, rows)
        session.execute(update(Chunk).where(Chunk.job_id == job_id).values(state="done"))
        assert finalize_job(session, job_id, 0.0002, 0.0015)


def csv_file(n: int) -> bytes:
    return ("id,text\n" + "".join(f"r{i},text number {i}\n" for i in range(n))).encode()


def queued_tasks(settings, queue: str = "cpu") -> list[tuple[str, list]]:
    messages = redis.Redis.from_url(settings.redis_url).lrange(queue, 0, -1)
    return [
        (m["headers"]["task"], json.loads(base64.b64decode(m["body"]))[0])
        for m in map(json.loads, messages)
    ]


def test_results_and_summary_reach_the_outbox(s, account_factory):
    account, _ = account_factory()
    job_id = ingest(s, account, "orders.csv.gz", gzip.compress(csv_file(6)))
    assert write_outbox(job_id, s) is None  # not final yet: nothing written
    finish(job_id, 6, failed={3})

    written = write_outbox(job_id, s)
    assert written == {
        "job": str(job_id),
        "results": "orders-results.csv",
        "summary": "orders-summary.json",
    }
    folder = s.outbox_dir / account.name
    assert sorted(p.name for p in folder.iterdir()) == ["orders-results.csv", "orders-summary.json"]
    rows = list(csv.DictReader(io.StringIO((folder / "orders-results.csv").read_text())))
    assert [r["id"] for r in rows] == [f"r{i}" for i in range(6)]
    assert rows[1]["label"] == "billing" and rows[3]["error"] == "model failed"
    summary = json.loads((folder / "orders-summary.json").read_text())
    assert summary["file"]["name"] == "orders.csv.gz" and summary["results"] == "orders-results.csv"
    assert summary["status"] == "partial" and summary["account"] == account.name
    assert summary["counts"] == {"total": 6, "succeeded": 5, "failed": 1}
    assert summary["label_counts"] == {"billing": 2, "praise": 3}
    assert summary["failures"] == {
        "count": 1,
        "without_result": 0,
        "by_error": {"model failed": 1},
        "examples": [{"id": "r3", "error": "model failed"}],
    }
    assert summary["cost"]["currency"] == "USD" and summary["timings"]["finished_at"]
    with session_scope() as session:
        row = session.query(InboxFile).filter_by(job_id=job_id).one()
        assert row.outbox_written_at is not None


def test_a_jsonl_input_gets_jsonl_results_and_later_files_never_overwrite(s, account_factory):
    account, _ = account_factory()
    lines = "".join(json.dumps({"id": f"r{i}", "text": f"t {i}"}) + "\n" for i in range(3))
    first = ingest(s, account, "daily.jsonl", lines.encode())
    second = ingest(s, account, "daily.jsonl", (lines + '{"id": "x", "text": "y"}\n').encode())
    finish(first, 3)
    finish(second, 4)
    assert write_outbox(first, s)["results"] == "daily-results.jsonl"
    assert write_outbox(second, s)["results"] == "daily-2-results.jsonl"
    folder = s.outbox_dir / account.name
    records = [json.loads(x) for x in (folder / "daily-results.jsonl").read_text().splitlines()]
    assert [r["id"] for r in records] == ["r0", "r1", "r2"] and records[0]["label"] == "praise"
    assert len((folder / "daily-2-results.jsonl").read_text().splitlines()) == 4


@pytest.mark.parametrize("where", ["other account", "outside", "dangling"])
def test_a_linked_outbox_folder_is_refused_and_nothing_written_through_it(
    s, account_factory, tmp_path, where, monkeypatch, worker_app
):
    account, _ = account_factory()
    other, _ = account_factory()
    job_id = ingest(s, account, "orders.csv", csv_file(2))
    finish(job_id, 2)
    theirs, outside = s.outbox_dir / other.name, tmp_path / "outside"
    theirs.mkdir(parents=True)
    outside.mkdir()
    target = {"other account": other.name, "outside": str(outside), "dangling": "/nowhere"}
    os.symlink(target[where], s.outbox_dir / account.name)

    with pytest.raises(Refused, match="symbolic link"):
        write_outbox(job_id, s)
    # The task says so, in its result and its log, and fails no further.
    worker_app(s)
    told = write_outbox_task.run(str(job_id))
    assert told["written"] is False and "symbolic link (never followed)" in told["refused"]
    assert not list(theirs.iterdir()) and not list(outside.iterdir())
    with session_scope() as session:
        assert session.query(InboxFile).filter_by(job_id=job_id).one().outbox_written_at is None

    # The account's folder made real again, the next attempt (the reconciler's) writes.
    os.unlink(s.outbox_dir / account.name)
    assert write_outbox(job_id, s)["results"] == "orders-results.csv"


def test_links_planted_under_the_outbox_names_are_replaced_never_followed(
    s, account_factory, tmp_path
):
    account, _ = account_factory()
    job_id = ingest(s, account, "orders.csv", csv_file(3))
    finish(job_id, 3)
    victim = tmp_path / "victim.txt"
    victim.write_text("keep me")
    folder = s.outbox_dir / account.name
    folder.mkdir(parents=True)
    os.symlink(victim, folder / "orders-results.csv")
    os.symlink(victim, folder / "orders-summary.json")
    os.symlink(victim, folder / ".orders-results.csv.0000dead.tmp")  # a "stale" temp file

    write_outbox(job_id, s)

    assert victim.read_text() == "keep me"
    results = folder / "orders-results.csv"
    assert not results.is_symlink() and len(results.read_text().splitlines()) == 4
    assert not (folder / "orders-summary.json").is_symlink()
    assert sorted(os.listdir(folder)) == ["orders-results.csv", "orders-summary.json"]


def test_finalizing_an_inbox_job_sends_its_outbox_writer(s, account_factory, settings):
    account, _ = account_factory()
    job_id = ingest(s, account, "a.csv", csv_file(2))
    assert send_outbox([str(uuid.uuid4())], settings) == []  # not an inbox job: nothing sent
    assert send_outbox([str(job_id)], settings) == [str(job_id)]
    assert ("laneway.write_outbox", [str(job_id)]) in queued_tasks(settings)


def test_the_reconciler_sends_a_lost_outbox_writer_again(s, account_factory, settings):
    account, _ = account_factory()
    job_id = ingest(s, account, "lost.csv", csv_file(2))
    finish(job_id, 2)
    assert str(job_id) not in resend_lost_outbox(
        settings
    )  # just finished: its message may be queued
    with session_scope() as session:
        session.execute(
            update(InboxFile)
            .where(InboxFile.job_id == job_id)
            .values(outbox_sent_at=utcnow() - timedelta(hours=3))
        )
    assert str(job_id) in resend_lost_outbox(settings)
    assert str(job_id) not in resend_lost_outbox(settings)  # once per visibility timeout
    assert ("laneway.write_outbox", [str(job_id)]) in queued_tasks(settings)


def test_the_webhook_is_told_and_asked_again_after_an_error(s, account_factory):
    account, _ = account_factory()
    job_id = ingest(s, account, "hooked.csv", csv_file(2))
    finish(job_id, 2)
    assert notify_webhook(job_id, s) is False  # the account has no webhook
    with Receiver(fail=1) as receiver:
        secret_url = f"{receiver.url}/hooks/laneway?token=s3cr3t-{uuid.uuid4().hex}"
        with session_scope() as session:
            session.get(type(account), account.id).webhook_url = secret_url
        with pytest.raises(WebhookError) as failure:
            notify_webhook(job_id, s)
        assert str(failure.value) == "the webhook answered 500"  # and not the URL
        assert notify_webhook(job_id, s) is True
        assert notify_webhook(job_id, s) is False  # told once
    ((path, notice),) = receiver.notices
    assert path.startswith("/hooks/laneway?token=s3cr3t-")
    assert notice == {
        "event": "job.finished",
        "job": str(job_id),
        "account": account.name,
        "status": "succeeded",
        "counts": {"total": 2, "succeeded": 2, "failed": 0},
        "file": "hooked.csv",
        "results": "hooked-results.csv",
        "summary": "hooked-summary.json",
    }


def test_an_unreachable_webhook_is_an_error_without_its_url(s, account_factory):
    account, _ = account_factory()
    job_id = ingest(s, account, "nowhere.csv", csv_file(1))
    finish(job_id, 1)
    with Receiver() as receiver:
        closed = receiver.url  # nothing listens there once the receiver stops
    with session_scope() as session:
        session.get(type(account), account.id).webhook_url = f"{closed}/x?token=t0ps3cret"
    with pytest.raises(WebhookError, match="could not be reached") as failure:
        notify_webhook(job_id, s)
    assert "t0ps3cret" not in str(failure.value) and "127.0.0.1" not in str(failure.value)


def test_an_inbox_job_finalized_by_the_reconciler_gets_its_outbox(s, account_factory, settings):
    from db.models import Chunk
    from tasks.maintenance import finalize_orphaned_jobs

    account, _ = account_factory()
    job_id = ingest(s, account, "orphan.csv", csv_file(3))
    with session_scope() as session:
        upsert_results(
            session,
            job_id,
            [
                {"idx": i, "item_id": f"r{i}", "label": "x", "output": {}, "error": None}
                for i in range(3)
            ],
        )
        session.execute(update(Chunk).where(Chunk.job_id == job_id).values(state="done"))
    assert str(job_id) in finalize_orphaned_jobs()  # its chord callback was lost
    assert ("laneway.write_outbox", [str(job_id)]) in queued_tasks(settings)
