"""The `laneway` commands for webhooks and the inbox, in this process on the real Postgres."""

from __future__ import annotations

import uuid

from click.testing import CliRunner
from sqlalchemy import select

from db.models import Account
from db.session import session_scope
from fleet.cli import cli


def webhook_of(name: str) -> str | None:
    with session_scope() as session:
        return session.scalar(select(Account.webhook_url).where(Account.name == name))


def test_accounts_get_set_and_clear_a_webhook_without_echoing_it(migrated):
    runner = CliRunner()
    name = f"hook-{uuid.uuid4().hex[:6]}"
    url = "https://hooks.example.com/laneway?token=t0ps3cret"
    created = runner.invoke(cli, ["accounts", "create", name, "--webhook", url])
    assert created.exit_code == 0, created.output
    assert webhook_of(name) == url and "t0ps3cret" not in created.output

    for bad in ("ftp://x/y", "not a url", "https://"):
        refused = runner.invoke(cli, ["accounts", "webhook", name, bad])
        assert refused.exit_code == 2 and "http:// or https:// URL" in refused.output
    assert webhook_of(name) == url

    other = "http://10.0.0.5:8080/notify"
    assert runner.invoke(cli, ["accounts", "webhook", name, other]).exit_code == 0
    assert webhook_of(name) == other
    cleared = runner.invoke(cli, ["accounts", "webhook", name, "--clear"])
    assert cleared.exit_code == 0 and "cleared" in cleared.output
    assert webhook_of(name) is None
    assert runner.invoke(cli, ["accounts", "webhook", name]).exit_code == 2  # URL or --clear
    missing = runner.invoke(cli, ["accounts", "webhook", "no-such-account", other])
    assert missing.exit_code == 1 and "no account named" in missing.output


def test_inbox_scan_reports_each_file(migrated, tmp_path, account_factory, monkeypatch):
    from core.config.settings import get_settings

    account, _ = account_factory()
    monkeypatch.setenv("LANEWAY_INBOX_DIR", str(tmp_path / "inbox"))
    monkeypatch.setenv("LANEWAY_INBOX_SETTLE", "0")
    get_settings.cache_clear()
    try:
        runner = CliRunner()
        empty = runner.invoke(cli, ["inbox", "scan"])
        assert empty.exit_code == 0 and "nothing in" in empty.output
        folder = tmp_path / "inbox" / account.name
        folder.mkdir()
        (folder / "a.csv").write_text("id,text\n1,hello there\n")
        (folder / "b.jsonl").write_text("not json\n")
        scanned = runner.invoke(cli, ["inbox", "scan"])
        assert scanned.exit_code == 0, scanned.output
        assert f"ingested  {account.name}/a.csv job " in scanned.output
        assert f"rejected  {account.name}/b.jsonl: line 1: not valid JSON" in scanned.output
    finally:
        get_settings.cache_clear()
