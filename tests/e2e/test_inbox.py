"""The nightly path end to end: real `celery beat` schedules the inbox scan, a real worker
ingests the files, runs the jobs, writes the outbox and tells a real webhook receiver."""

from __future__ import annotations

import csv
import gzip
import io
import json
import os
import subprocess
import uuid

import pytest

from core.vocab import DEFAULT_LABELS
from tests import bombs
from tests.e2e.procs import BIN, Proc, start_worker, wait_for
from tests.receiver import Receiver

pytestmark = pytest.mark.e2e

TEXTS = [
    "I was charged twice for my subscription",
    "The parcel is three days late",
    "Great service, thank you",
    "I cannot log in to my account",
]


def test_beat_scans_the_inbox_on_schedule_and_results_reach_the_outbox(
    migrated, account_factory, tmp_path
):
    account, _ = account_factory("standard")
    inbox, outbox = tmp_path / "inbox", tmp_path / "outbox"
    env = {
        "LANEWAY_INBOX_DIR": str(inbox),
        "LANEWAY_OUTBOX_DIR": str(outbox),
        "LANEWAY_INBOX_SETTLE": "1",
        "LANEWAY_INBOX_SCHEDULE": "* * * * *",  # every minute: the test waits one at most
    }
    folder = inbox / account.name
    folder.mkdir(parents=True)
    buf = io.StringIO()
    writer = csv.writer(buf)
    writer.writerow(["id", "text"])
    writer.writerows([f"o{i}", f"{TEXTS[i % 4]} (order {i})"] for i in range(12))
    (folder / "orders.csv").write_text(buf.getvalue())
    lines = "".join(
        json.dumps({"id": f"t{i}", "text": f"{TEXTS[i % 4]} (ticket {i})"}) + "\n"
        for i in range(10)
    )
    (folder / "tickets.jsonl.gz").write_bytes(gzip.compress(lines.encode()))
    (folder / "broken.csv").write_text('id,text\n1,fine\n2,"never closed\n')
    # What an attacker drops beside them: none of it may stop the night's files.
    secret = tmp_path / "secret.csv"
    secret.write_text("id,text\ns1,another account's secret\n")
    os.symlink(secret, folder / "stolen.csv")
    os.mkfifo(folder / "pipe.csv")
    (folder / "nothing.jsonl.gz").write_bytes(bombs.nothing("newlines.jsonl.gz"))

    with Receiver(fail=1) as receiver:
        token = f"s3cr3t{uuid.uuid4().hex}"
        hook = f"{receiver.url}/hook?token={token}"
        told = subprocess.run(
            [str(BIN / "laneway"), "accounts", "webhook", account.name, hook],
            capture_output=True,
            text=True,
            check=True,
        )
        assert "webhook set" in told.stdout and token not in told.stdout + told.stderr

        worker = start_worker("cpu", [str(BIN / "laneway"), "worker", "cpu"], tmp_path, env)
        beat = Proc("beat", [str(BIN / "laneway"), "beat"], tmp_path, env)
        procs = [worker, beat]
        try:
            summaries = [outbox / account.name / f"{n}-summary.json" for n in ("orders", "tickets")]
            wait_for(lambda: all(p.exists() for p in summaries), 300, "the outbox", procs)
            # The first notice is refused (500): the worker asks again, with backoff.
            wait_for(lambda: len(receiver.notices) == 2, 60, "two webhook notices", procs)
        finally:
            beat.stop()
            worker.stop()

    assert "laneway.scan_inbox" in beat.log.read_text()  # sent by beat, not by the test
    processed = sorted(p.name for p in (folder / "processed").iterdir())
    assert processed == ["orders.csv", "tickets.jsonl.gz"]
    report = (folder / "rejected" / "broken.csv.error.txt").read_text()
    assert "line 3: malformed CSV" in report
    for name, problem in (
        ("stolen.csv", "a symbolic link (never followed)"),
        ("pipe.csv", "a named pipe (FIFO)"),
        ("nothing.jsonl.gz", "LANEWAY_MAX_BLANK_LINES"),
    ):
        assert problem in (folder / "rejected" / f"{name}.error.txt").read_text()
    assert os.readlink(folder / "rejected" / "stolen.csv") == str(secret)

    rows = list(csv.DictReader((outbox / account.name / "orders-results.csv").open()))
    assert [r["id"] for r in rows] == [f"o{i}" for i in range(12)]
    assert all(r["label"] in DEFAULT_LABELS and not r["error"] for r in rows)
    records = [
        json.loads(line)
        for line in (outbox / account.name / "tickets-results.jsonl").read_text().splitlines()
    ]
    assert [r["id"] for r in records] == [f"t{i}" for i in range(10)]
    summary = json.loads((outbox / account.name / "orders-summary.json").read_text())
    assert summary["status"] == "succeeded" and summary["source"] == "inbox"
    assert summary["counts"] == {"total": 12, "succeeded": 12, "failed": 0}
    assert sum(summary["label_counts"].values()) == 12 and summary["cost"]["total"] > 0
    assert summary["timings"]["run_seconds"] > 0 and summary["stage_seconds"]["model"] > 0

    notices = {n["file"]: (path, n) for path, n in receiver.notices}
    assert set(notices) == {"orders.csv", "tickets.jsonl.gz"}
    path, notice = notices["orders.csv"]
    assert path == f"/hook?token={token}" and notice["job"] == summary["id"]
    assert notice["status"] == "succeeded" and notice["results"] == "orders-results.csv"
    assert receiver.attempts == 3
    for proc in procs:
        assert token not in proc.log.read_text(), f"{proc.name} logged the webhook URL"
