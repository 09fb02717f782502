"""The inbox as an attacker fills it: links to other accounts' files and out of the tree,
pipes, sockets, devices, hard links, linked folders, control characters in names, gzip
files of nothing. Each is refused with a report (or left in place when nothing safe can
hold it), and never keeps another file or another account's file from being taken."""

from __future__ import annotations

import gzip
import json
import logging
import os
import socket
import stat
import subprocess
import time
import uuid

import pytest
from sqlalchemy import select

from core.config.settings import Settings
from db.models import Job, JobItem
from db.session import session_scope
from jobs.inbox import PROCESSED, REJECTED, WORKING, scan_inbox
from tests import bombs
from tests.e2e.procs import BIN
from tests.integration.test_inbox import by_name, drop, jobs_of_account, lines_csv, lines_jsonl

SECRET = "the other account's secret order"


def inbox_settings(tmp_path, **env: str) -> Settings:
    return Settings.from_env(
        {
            **os.environ,
            "LANEWAY_INBOX_DIR": str(tmp_path / "inbox"),
            "LANEWAY_OUTBOX_DIR": str(tmp_path / "outbox"),
            "LANEWAY_INBOX_SETTLE": "0",
            **env,
        }
    )


@pytest.fixture
def inbox(tmp_path, settings, migrated) -> Settings:
    return inbox_settings(tmp_path)


@pytest.fixture
def two(inbox, account_factory):
    """An attacker's and a victim's folders, the victim's holding a secret file in its
    inbox and one already processed."""
    attacker, _ = account_factory("enterprise")
    victim, _ = account_factory("enterprise")
    secret = f'id,text\ns1,"{SECRET}"\n'.encode()
    drop(inbox, victim.name, "waiting.csv", secret)
    done = inbox.inbox_dir / victim.name / PROCESSED
    done.mkdir(parents=True)
    (done / "done.csv").write_bytes(secret)
    return attacker, victim


def texts_of(account_id: int) -> list[str]:
    with session_scope() as session:
        rows = session.scalars(
            select(JobItem.text)
            .join(Job, Job.id == JobItem.job_id)
            .where(Job.account_id == account_id)
        )
        return list(rows)


def report(inbox, account: str, name: str) -> str:
    return (inbox.inbox_dir / account / REJECTED / f"{name}.error.txt").read_text()


def test_links_are_never_followed_and_never_stop_the_scan(inbox, two, tmp_path):
    attacker, victim = two
    mine = inbox.inbox_dir / attacker.name
    drop(inbox, attacker.name, "a-good.csv", lines_csv(3, "mine"))
    elsewhere = tmp_path / "elsewhere.csv"
    elsewhere.write_bytes(lines_csv(2, "outside"))
    links = {
        "abs-passwd.csv": "/etc/passwd",
        "abs-victim.csv": str(inbox.inbox_dir / victim.name / "waiting.csv"),
        "rel-victim.csv": f"../{victim.name}/waiting.csv",
        "rel-processed.csv": f"../{victim.name}/{PROCESSED}/done.csv",
        "elsewhere.csv": str(elsewhere),
        "dangling.csv": "../nobody/nothing.csv",
        "proc.jsonl": "/proc/self/environ",
        "loop.csv": "loop.csv",
    }
    for name, target in links.items():
        os.symlink(target, mine / name)

    outcomes = by_name(scan_inbox(inbox))

    assert outcomes["a-good.csv"].status == "ingested"
    assert outcomes["waiting.csv"].status == "ingested"  # the victim's own, by the victim
    for name, target in links.items():
        assert outcomes[name].status == "rejected", name
        assert "a symbolic link (never followed)" in outcomes[name].detail
        assert "symbolic link" in report(inbox, attacker.name, name)
        # The link itself moved to rejected/, its target untouched.
        assert os.readlink(mine / REJECTED / name) == target
    assert SECRET not in " ".join(texts_of(attacker.id))
    assert not any(t.startswith("root:") for t in texts_of(attacker.id))
    assert SECRET in texts_of(victim.id)
    assert (inbox.inbox_dir / victim.name / PROCESSED / "done.csv").read_bytes().startswith(b"id")
    assert elsewhere.read_bytes() == lines_csv(2, "outside")


def test_a_hard_link_to_another_accounts_file_is_refused(inbox, two):
    attacker, victim = two
    mine = inbox.inbox_dir / attacker.name
    mine.mkdir()
    os.link(inbox.inbox_dir / victim.name / PROCESSED / "done.csv", mine / "linked.csv")
    drop(inbox, attacker.name, "own.csv", lines_csv(2, "own"))

    outcomes = by_name(scan_inbox(inbox))

    assert outcomes["linked.csv"].status == "rejected"
    assert "2 hard links" in outcomes["linked.csv"].detail
    assert "hard links" in report(inbox, attacker.name, "linked.csv")
    assert outcomes["own.csv"].status == "ingested"
    assert SECRET not in " ".join(texts_of(attacker.id))
    assert (inbox.inbox_dir / victim.name / PROCESSED / "done.csv").exists()


def test_pipes_sockets_devices_and_folders_are_not_read(inbox, account_factory, tmp_path):
    account, _ = account_factory()
    folder = inbox.inbox_dir / account.name
    folder.mkdir(parents=True)
    os.mkfifo(folder / "pipe.csv")  # opening it to read would wait for a writer forever
    listening = socket.socket(socket.AF_UNIX)
    listening.bind(str(folder / "sock.jsonl"))
    (folder / "dir.csv").mkdir()
    (folder / "dir.csv" / "inner.csv").write_bytes(lines_csv(2, "inner"))
    try:
        os.mknod(folder / "null.csv", 0o600 | stat.S_IFCHR, os.makedev(1, 3))
        devices = ["null.csv"]
    except PermissionError:
        devices = []  # not root here: no device file can be made, so none can be dropped
    drop(inbox, account.name, "fine.jsonl", lines_jsonl(4, "fine"))

    started = time.monotonic()
    outcomes = by_name(scan_inbox(inbox))
    listening.close()

    assert time.monotonic() - started < 60
    assert outcomes["fine.jsonl"].status == "ingested"
    kinds = {"pipe.csv": "named pipe", "sock.jsonl": "socket", "null.csv": "character device"}
    for name in ["pipe.csv", "sock.jsonl", *devices]:
        assert outcomes[name].status == "rejected", name
        assert kinds[name] in outcomes[name].detail
        assert kinds[name] in report(inbox, account.name, name)
    assert outcomes["dir.csv"].status == "ignored"
    assert (folder / "dir.csv" / "inner.csv").exists()
    assert "inner.csv" not in outcomes


@pytest.mark.parametrize("sub", [PROCESSED, REJECTED])
@pytest.mark.parametrize("target", ["victim", "outside", "dangling", "a file"])
def test_a_linked_processed_or_rejected_folder_stops_that_account_only(
    inbox, two, tmp_path, sub, target
):
    attacker, victim = two
    mine = inbox.inbox_dir / attacker.name
    drop(inbox, attacker.name, "good.csv", lines_csv(2, "good"))
    drop(inbox, attacker.name, "bad.csv", b"not,a header\n")
    outside = tmp_path / "outside"
    outside.mkdir()
    if target == "a file":
        (mine / sub).write_text("a file where a folder goes")
    else:
        where = {
            "victim": f"../{victim.name}",
            "outside": str(outside),
            "dangling": "/nonexistent/folder",
        }[target]
        os.symlink(where, mine / sub)

    outcomes = scan_inbox(inbox)

    mine_out = [o for o in outcomes if o.account == attacker.name]
    assert [(o.name, o.status) for o in mine_out] == [(sub, "rejected")]
    assert "nothing is taken from this account's folder" in mine_out[0].detail
    assert (mine / "good.csv").exists() and (mine / "bad.csv").exists()
    assert not list(outside.iterdir())
    assert {o.name: o.status for o in outcomes if o.account == victim.name} == {
        "waiting.csv": "ingested"
    }
    # Nothing of the attacker's reached the victim's folder (where one link led).
    assert os.listdir(inbox.inbox_dir / victim.name) == [PROCESSED]
    assert sorted(os.listdir(inbox.inbox_dir / victim.name / PROCESSED)) == [
        "done.csv",
        "waiting.csv",
    ]
    assert jobs_of_account(attacker.id) == 0


def test_a_linked_account_folder_is_refused_and_its_target_untouched(inbox, two, tmp_path):
    attacker, victim = two
    # The attacker's folder is a link to the victim's; another name links to a system-like
    # folder outside the inbox. A decoy stands in for /etc: a regression in this test must
    # never move a real system folder's files into a rejected/ beside them.
    os.symlink(victim.name, inbox.inbox_dir / attacker.name)
    decoy = tmp_path / "etc"
    decoy.mkdir()
    (decoy / "passwd").write_text("root:x:0:0:root:/root:/bin/bash\n")
    os.symlink(decoy, inbox.inbox_dir / "etc")
    fifo = inbox.inbox_dir / "top-pipe"
    os.mkfifo(fifo)

    outcomes = scan_inbox(inbox)

    refused = {o.name: o for o in outcomes if o.account == ""}
    assert refused[attacker.name].status == "rejected"
    assert "a symbolic link (never followed)" in refused[attacker.name].detail
    assert refused["etc"].status == "rejected" and refused["top-pipe"].status == "rejected"
    # The victim's file is taken once, as the victim's.
    taken = [o for o in outcomes if o.status == "ingested"]
    assert [(o.account, o.name) for o in taken] == [(victim.name, "waiting.csv")]
    assert jobs_of_account(attacker.id) == 0
    assert os.path.islink(inbox.inbox_dir / attacker.name) and fifo.exists()
    assert sorted(os.listdir(decoy)) == ["passwd"]  # nothing moved out of it or into it


def test_a_linked_working_folder_is_set_aside_and_nothing_written_through_it(
    inbox, account_factory, tmp_path
):
    account, _ = account_factory()
    target = tmp_path / "target"
    target.mkdir()
    inbox.inbox_dir.mkdir(parents=True)
    os.symlink(target, inbox.inbox_dir / WORKING)
    drop(inbox, account.name, "orders.csv", lines_csv(3))

    (outcome,) = scan_inbox(inbox)

    assert outcome.status == "ingested"
    assert not list(target.iterdir())
    assert (inbox.inbox_dir / WORKING).is_dir() and not (inbox.inbox_dir / WORKING).is_symlink()
    aside = [p for p in inbox.inbox_dir.iterdir() if p.name.startswith(f"{WORKING}.refused-")]
    assert len(aside) == 1 and os.readlink(aside[0]) == str(target)


@pytest.mark.slow
def test_control_characters_in_names_never_forge_a_line(inbox, account_factory, tmp_path):
    account, _ = account_factory()
    folder = inbox.inbox_dir / account.name
    hostile = [
        "evil\ningested   fake-forged.csv job 1: 1 items.csv",
        "cr\rrejected.jsonl",
        "esc\x1b[2Kred.csv",
        "sep\u2028line.csv",
    ]
    for name in hostile:
        drop(inbox, account.name, name, lines_csv(2, name[:2]))
    folder_b = os.fsencode(folder)
    with open(os.path.join(folder_b, b"bad-\xff\xfe.csv"), "wb") as fh:
        fh.write(lines_csv(2, "ff"))
    drop(inbox, account.name, "plain.csv", lines_csv(2, "plain"))
    # A folder named as no account can be named with a newline too.
    drop(inbox, "no\nbody", "x.csv", lines_csv(1))

    env = {**os.environ, "LANEWAY_INBOX_DIR": str(inbox.inbox_dir), "LANEWAY_INBOX_SETTLE": "0"}
    scan = subprocess.run(
        [str(BIN / "laneway"), "inbox", "scan"], env=env, capture_output=True, timeout=300
    )
    assert scan.returncode == 0, scan.stderr[-2000:]
    out = scan.stdout.decode()
    err = scan.stderr.decode()
    assert "Traceback" not in err
    # One line per entry: 5 hostile names, plain.csv, and the unknown account's file.
    lines = out.splitlines()
    assert len(lines) == 7, out
    assert sum(line.startswith("ingested") for line in lines) == 1
    assert sum(line.startswith("rejected") for line in lines) == 6
    assert "forged.csv" not in "".join(line for line in lines if line.startswith("ingested"))
    for line in err.splitlines():
        assert line.startswith((account.name, "'no\\nbody'/")), line
    for name in os.listdir(folder_b + b"/" + REJECTED.encode()):
        if name.endswith(b".error.txt"):
            text = (folder / REJECTED / os.fsdecode(name)).read_text()
            assert len(text.splitlines()) == 5, text  # name, blank, problem, blank, advice
            assert "control character or an invalid byte" in text or "no account" in text
    assert sorted(os.listdir(folder / PROCESSED)) == ["plain.csv"]
    assert jobs_of_account(account.id) == 1


def test_the_beat_task_logs_names_escaped(inbox, account_factory, caplog, monkeypatch, worker_app):
    from tasks.inbox import scan_inbox_task

    account, _ = account_factory()
    drop(inbox, account.name, "a\nb.csv", lines_csv(1))
    worker_app(inbox)
    with caplog.at_level(logging.INFO, logger="jobs.inbox"):
        result = scan_inbox_task.run()
    assert result["counts"] == {"rejected": 1}
    assert result["files"][0]["name"] == "'a\\nb.csv'"
    json.dumps(result)  # storable as the task's result
    messages = [r.getMessage() for r in caplog.records]
    assert messages and all("\n" not in m for m in messages)


@pytest.mark.parametrize("name", ["newlines.csv.gz", "spaced-lines.jsonl.gz", "empty-cells.csv.gz"])
def test_a_gzip_file_of_nothing_is_rejected_quickly(inbox, account_factory, name):
    account, _ = account_factory()
    drop(inbox, account.name, name, bombs.nothing(name))
    drop(inbox, account.name, "fine.csv", lines_csv(2))
    started = time.monotonic()
    outcomes = by_name(scan_inbox(inbox))
    assert time.monotonic() - started < 30
    assert outcomes["fine.csv"].status == "ingested"
    assert outcomes[name].status == "rejected"
    assert "without an item" in report(inbox, account.name, name)


def test_the_inbox_byte_limit_counts_inflated_bytes(tmp_path, settings, migrated, account_factory):
    s = inbox_settings(tmp_path, LANEWAY_INBOX_MAX_BYTES="4096")
    account, _ = account_factory()
    big = lines_jsonl(200, "big")  # ~9 KB inflated
    drop(s, account.name, "packed.jsonl.gz", gzip.compress(big))
    drop(s, account.name, "plain.jsonl", big)
    drop(s, account.name, "small.jsonl.gz", gzip.compress(lines_jsonl(10)))
    outcomes = by_name(scan_inbox(s))
    assert outcomes["small.jsonl.gz"].status == "ingested"
    assert outcomes["packed.jsonl.gz"].detail == (
        "the gzip file inflates to more than 4096 bytes, the limit of LANEWAY_INBOX_MAX_BYTES"
    )
    assert outcomes["plain.jsonl"].detail == (
        "the file has more than 4096 bytes, the limit of LANEWAY_INBOX_MAX_BYTES"
    )


def test_an_unreadable_file_is_rejected_and_the_scan_goes_on(inbox, account_factory):
    if os.geteuid() == 0:
        pytest.skip("root reads every file")
    account, _ = account_factory()
    path = drop(inbox, account.name, "locked.csv", lines_csv(2))
    path.chmod(0)
    drop(inbox, account.name, "open.csv", lines_csv(2, "o"))
    outcomes = by_name(scan_inbox(inbox))
    assert outcomes["open.csv"].status == "ingested"
    assert outcomes["locked.csv"].status == "rejected"
    assert "cannot be opened" in outcomes["locked.csv"].detail


def test_names_as_long_as_a_name_may_be_get_their_report_and_their_results(inbox, account_factory):
    from jobs.outbox import write_outbox
    from tests.integration.test_outbox import finish

    account, _ = account_factory()
    bad, good = "b" * 251 + ".csv", "g" * 251 + ".csv"  # 255 bytes, the most there is
    drop(inbox, account.name, bad, b"no header here\n")
    drop(inbox, account.name, good, b"id,text\nr0,a text\nr1,another\n")
    outcomes = by_name(scan_inbox(inbox))
    assert outcomes[bad].status == "rejected" and outcomes[good].status == "ingested"
    reports = [n for n in os.listdir(inbox.inbox_dir / account.name / REJECTED) if n != bad]
    assert len(reports) == 1 and reports[0].endswith(".error.txt")
    finish(uuid.UUID(outcomes[good].job_id), 2)
    written = write_outbox(uuid.UUID(outcomes[good].job_id), inbox)
    assert (inbox.outbox_dir / account.name / written["results"]).exists()


def test_what_a_dead_scan_left_is_put_back_without_following_links(inbox, two):
    attacker, victim = two
    dead = inbox.inbox_dir / WORKING / "host-1-dead"
    (dead / attacker.name).mkdir(parents=True)
    (dead / ".lock").write_text("")  # nobody holds it
    os.symlink("/etc/passwd", dead / attacker.name / "evil.csv")
    # A second dead scan whose "account folder" is a link to the victim's folder.
    other = inbox.inbox_dir / WORKING / "host-2-dead"
    other.mkdir()
    (other / ".lock").write_text("")
    os.symlink(inbox.inbox_dir / victim.name, other / "linked")

    outcomes = {(o.account, o.name): o for o in scan_inbox(inbox)}

    evil = outcomes[(attacker.name, "evil.csv")]
    assert evil.status == "rejected" and "symbolic link" in evil.detail
    assert os.readlink(inbox.inbox_dir / attacker.name / REJECTED / "evil.csv") == "/etc/passwd"
    assert outcomes[(victim.name, "waiting.csv")].status == "ingested"
    assert not (inbox.inbox_dir / "linked").exists()  # nothing put back through the link
    assert not dead.exists()


def test_an_unexpected_failure_on_one_file_never_stops_the_others(inbox, two, monkeypatch):
    import jobs.inbox

    attacker, victim = two
    drop(inbox, attacker.name, "boom.csv", lines_csv(2, "boom"))
    drop(inbox, attacker.name, "calm.csv", lines_csv(2, "calm"))
    real = jobs.inbox.store_file

    def store(settings, account, name, *args, **kwargs):
        if name == "boom.csv":
            raise RecursionError("what a parser might hit on a hostile file")
        return real(settings, account, name, *args, **kwargs)

    monkeypatch.setattr(jobs.inbox, "store_file", store)
    outcomes = {(o.account, o.name): o for o in scan_inbox(inbox)}
    boom = outcomes[(attacker.name, "boom.csv")]
    assert boom.status == "waiting" and "RecursionError" in boom.detail
    assert (inbox.inbox_dir / attacker.name / "boom.csv").exists()  # back for the next scan
    assert outcomes[(attacker.name, "calm.csv")].status == "ingested"
    assert outcomes[(victim.name, "waiting.csv")].status == "ingested"
