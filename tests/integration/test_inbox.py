"""The inbox scan in this process against the real Postgres and Redis (no worker runs the
jobs here: a job's chunk messages wait in the broker)."""

from __future__ import annotations

import gzip
import json
import os
import subprocess
import uuid
from pathlib import Path

import pytest
import redis
from sqlalchemy import func, select

from core.config.settings import Settings
from db.models import Chunk, InboxFile, Job, JobItem
from db.session import session_scope
from jobs.inbox import WORKING, scan_inbox
from tests.e2e.procs import BIN, wait_for


def lines_csv(n: int, prefix: str = "r") -> bytes:
    rows = "".join(f'{prefix}{i},"message number {i}, about a late parcel"\n' for i in range(n))
    return ("id,text\n" + rows).encode()


def lines_jsonl(n: int, prefix: str = "j") -> bytes:
    return "".join(
        json.dumps({"id": f"{prefix}{i}", "text": f"my card was charged twice ({i})"}) + "\n"
        for i in range(n)
    ).encode()


@pytest.fixture
def inbox(tmp_path, settings, migrated):
    """A fresh inbox and outbox; settle 0 unless a test asks for more."""

    def make(settle: int = 0) -> Settings:
        return Settings.from_env(
            {
                **os.environ,
                "LANEWAY_INBOX_DIR": str(tmp_path / "inbox"),
                "LANEWAY_OUTBOX_DIR": str(tmp_path / "outbox"),
                "LANEWAY_INBOX_SETTLE": str(settle),
            }
        )

    return make


def drop(s: Settings, account: str, name: str, data: bytes) -> Path:
    folder = s.inbox_dir / account
    folder.mkdir(parents=True, exist_ok=True)
    (folder / name).write_bytes(data)
    return folder / name


def job_of(job_id: str) -> tuple[Job, int, int]:
    key = uuid.UUID(job_id)
    with session_scope() as session:
        job = session.get(Job, key)
        session.expunge(job)
        items = session.scalar(select(func.count()).where(JobItem.job_id == key))
        chunks = session.scalar(select(func.count()).where(Chunk.job_id == key))
    return job, items, chunks


def jobs_of_account(account_id: int) -> int:
    with session_scope() as session:
        return session.scalar(select(func.count()).where(Job.account_id == account_id))


def by_name(outcomes) -> dict:
    return {o.name: o for o in outcomes}


def test_csv_and_gzipped_jsonl_files_become_jobs_and_move_to_processed(
    inbox, account_factory, settings
):
    s = inbox()
    account, _ = account_factory("enterprise")
    drop(s, account.name, "orders.csv", lines_csv(30))
    drop(s, account.name, "tickets.jsonl.gz", gzip.compress(lines_jsonl(50)))

    outcomes = by_name(scan_inbox(s))
    assert {o.status for o in outcomes.values()} == {"ingested"}
    csv_job, n, chunks = job_of(outcomes["orders.csv"].job_id)
    assert (n, csv_job.total_items, csv_job.source, csv_job.lane) == (30, 30, "inbox", "cpu")
    assert chunks == 2  # LANEWAY_CHUNK_SIZE is 16 in the tests
    gz_job, n, _ = job_of(outcomes["tickets.jsonl.gz"].job_id)
    assert (n, gz_job.lane) == (50, "gpu")  # enterprise, above LANEWAY_GPU_THRESHOLD (40)

    folder = s.inbox_dir / account.name
    assert sorted(p.name for p in (folder / "processed").iterdir()) == [
        "orders.csv",
        "tickets.jsonl.gz",
    ]
    assert not [p for p in folder.iterdir() if p.is_file()]
    assert not list((s.inbox_dir / WORKING).iterdir())  # the scan's working folder is gone
    with session_scope() as session:
        stems = dict(session.execute(select(InboxFile.name, InboxFile.stem)).all())
    assert stems["orders.csv"] == "orders" and stems["tickets.jsonl.gz"] == "tickets"
    # The chunk messages wait in the real broker, ids only.
    queued = redis.Redis.from_url(settings.redis_url).lrange("cpu", 0, -1)
    with session_scope() as session:
        task_ids = set(
            session.scalars(select(Chunk.task_id).where(Chunk.job_id == csv_job.id)).all()
        )
    assert task_ids <= {json.loads(m)["headers"]["id"] for m in queued}


def test_the_same_content_is_never_ingested_twice(inbox, account_factory):
    s = inbox()
    account, _ = account_factory()
    drop(s, account.name, "monday.jsonl", lines_jsonl(5, "dup"))
    first = scan_inbox(s)[0]
    assert first.status == "ingested"

    # The same content again, under another name and gzipped: still the same content.
    drop(s, account.name, "again.jsonl.gz", gzip.compress(lines_jsonl(5, "dup")))
    drop(s, account.name, "monday.jsonl", lines_jsonl(5, "dup"))
    outcomes = scan_inbox(s)
    assert {o.status for o in outcomes} == {"duplicate"}
    assert {o.job_id for o in outcomes} == {first.job_id}
    assert jobs_of_account(account.id) == 1
    rejected = s.inbox_dir / account.name / "rejected"
    report = (rejected / "again.jsonl.gz.error.txt").read_text()
    assert f"as job {first.job_id}" in report and "monday.jsonl" in report
    # A second file of the same name is kept beside the first, never over it.
    assert (s.inbox_dir / account.name / "processed" / "monday.jsonl").exists()
    assert (rejected / "monday.jsonl").exists()

    # Another account's identical file is its own: ingested, and no job of theirs named.
    other, _ = account_factory()
    drop(s, other.name, "monday.jsonl", lines_jsonl(5, "dup"))
    (theirs,) = scan_inbox(s)
    assert theirs.status == "ingested" and theirs.job_id != first.job_id


def test_a_file_still_being_written_waits_for_the_next_scan(inbox, account_factory):
    s = inbox(settle=2)
    account, _ = account_factory()
    content = lines_csv(40, "half")
    path = drop(s, account.name, "big.csv", content[: len(content) // 2])
    part = drop(s, account.name, "other.csv.part", lines_csv(3))  # an uploader's temp name
    gz = gzip.compress(lines_jsonl(20, "gz"))
    gz_path = drop(s, account.name, "late.jsonl.gz", gz[: len(gz) // 2])

    outcomes = by_name(scan_inbox(s))
    assert outcomes["big.csv"].status == "waiting" and "other.csv.part" not in outcomes
    assert outcomes["late.jsonl.gz"].status == "waiting"
    assert path.exists() and part.exists() and jobs_of_account(account.id) == 0

    path.write_bytes(content)  # the writer finishes
    seen: list = []

    def settled():
        seen.extend(scan_inbox(s))
        done = {o.name: o for o in seen if o.status == "ingested" or "incomplete" in o.detail}
        return done if len(done) == 2 else None

    done = wait_for(settled, 30, "both files to settle")
    assert job_of(done["big.csv"].job_id)[1] == 40  # every line, not the half seen first
    # The gzip file settled, but its stream has no end: it waits rather than be half-read.
    assert done["late.jsonl.gz"].status == "waiting"
    assert "gzip file ends early" in done["late.jsonl.gz"].detail
    assert gz_path.exists() and part.exists()
    gz_path.write_bytes(gz)

    def gz_ingested():
        return [o for o in scan_inbox(s) if o.name == "late.jsonl.gz" and o.status == "ingested"]

    assert job_of(wait_for(gz_ingested, 30, "late.jsonl.gz")[0].job_id)[1] == 20


def test_a_malformed_file_is_rejected_with_a_report_naming_the_line(inbox, account_factory):
    s = inbox()
    account, _ = account_factory()
    drop(s, account.name, "bad.jsonl", lines_jsonl(3) + b'{"id": "x", "text": \n')
    drop(s, account.name, "dups.csv", b"id,text\na,one\nb,two\na,three\n")
    drop(s, account.name, "notes.txt", b"hello")

    outcomes = by_name(scan_inbox(s))
    assert {o.status for o in outcomes.values()} == {"rejected"}
    assert outcomes["bad.jsonl"].detail.startswith("line 4: not valid JSON")
    assert outcomes["dups.csv"].detail == "line 4: duplicate id 'a' (first at line 2)"
    assert "unsupported file type" in outcomes["notes.txt"].detail
    assert jobs_of_account(account.id) == 0  # all or nothing: no job, no items
    rejected = s.inbox_dir / account.name / "rejected"
    assert "line 4: not valid JSON" in (rejected / "bad.jsonl.error.txt").read_text()
    assert (rejected / "bad.jsonl").read_bytes().startswith(b'{"id": "j0"')
    with session_scope() as session:
        assert session.scalar(select(func.count()).where(InboxFile.account_id == account.id)) == 0


def test_a_file_for_an_unknown_account_is_rejected(inbox):
    s = inbox()
    drop(s, "nobody-here", "orders.csv", lines_csv(2))
    (s.inbox_dir / "loose.csv").write_bytes(lines_csv(2))
    outcomes = by_name(scan_inbox(s))
    assert outcomes["orders.csv"].status == "rejected"
    assert "no account named 'nobody-here'" in outcomes["orders.csv"].detail
    report = s.inbox_dir / "nobody-here" / "rejected" / "orders.csv.error.txt"
    assert "no account named 'nobody-here'" in report.read_text()
    assert outcomes["loose.csv"].status == "ignored"
    assert (s.inbox_dir / "loose.csv").exists()


def test_files_left_by_a_scan_that_died_are_put_back(inbox, account_factory):
    s = inbox()
    account, _ = account_factory()
    dead = s.inbox_dir / WORKING / "host-1-dead" / account.name
    dead.mkdir(parents=True)
    (dead.parent / ".lock").write_text("")  # nobody holds its lock any more
    (dead / "orphan.csv").write_bytes(lines_csv(4))
    outcomes = scan_inbox(s)  # puts it back first, then takes it (settle 0)
    assert [(o.name, o.status) for o in outcomes] == [("orphan.csv", "ingested")]
    assert not (s.inbox_dir / WORKING / "host-1-dead").exists()


@pytest.mark.slow
def test_two_scans_at_once_take_each_content_once(inbox, account_factory, tmp_path):
    s = inbox()
    account, _ = account_factory()
    for i in range(6):
        drop(s, account.name, f"part{i}.jsonl", lines_jsonl(20, f"p{i}-"))
    drop(s, account.name, "copy.jsonl", lines_jsonl(20, "p0-"))  # part0's content again
    env = {
        **os.environ,
        "LANEWAY_INBOX_DIR": str(s.inbox_dir),
        "LANEWAY_INBOX_SETTLE": "0",
    }
    argv = [str(BIN / "laneway"), "inbox", "scan", "--json"]
    scans = [
        subprocess.Popen(argv, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        for _ in range(2)
    ]
    results = [scan.communicate(timeout=120) for scan in scans]
    assert [scan.returncode for scan in scans] == [0, 0], results
    outcomes = [json.loads(line) for out, _ in results for line in out.splitlines()]
    taken = [o for o in outcomes if o["status"] != "taken"]
    assert sorted(o["name"] for o in taken) == sorted(
        [f"part{i}.jsonl" for i in range(6)] + ["copy.jsonl"]
    )
    assert sorted(o["status"] for o in taken) == ["duplicate"] + ["ingested"] * 6
    assert jobs_of_account(account.id) == 6
    with session_scope() as session:
        assert session.scalar(select(func.count()).where(InboxFile.account_id == account.id)) == 6
    folder = s.inbox_dir / account.name
    assert len(list((folder / "processed").iterdir())) == 6
    assert [p.name for p in (folder / "rejected").iterdir() if not p.name.endswith(".txt")]


def test_a_gzip_file_truncated_long_ago_is_rejected(inbox, account_factory):
    s = inbox()
    account, _ = account_factory()
    gz = gzip.compress(lines_jsonl(20, "old"))
    path = drop(s, account.name, "stale.jsonl.gz", gz[: len(gz) // 2])
    two_days_ago = path.stat().st_mtime - 2 * 24 * 3600
    os.utime(path, (two_days_ago, two_days_ago))
    (outcome,) = scan_inbox(s)
    assert outcome.status == "rejected" and "gzip file ends early" in outcome.detail
    assert (s.inbox_dir / account.name / "rejected" / "stale.jsonl.gz.error.txt").exists()
    assert jobs_of_account(account.id) == 0
