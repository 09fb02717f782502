"""The `laneway` commands for webhooks and the inbox, in this process on the real Postgres."""

from __future__ import annotations

import uuid

import pytest
from click.testing import CliRunner
from sqlalchemy import select

from db.models import Account
from db.session import session_scope
from fleet.cli import cli
from tests.conftest import database_url
from tests.e2e.procs import free_port


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


def invoke_with(monkeypatch, argv: list[str], **env: str):
    """The command run with these settings, read afresh (the process caches its own)."""
    from core.config.settings import get_settings

    for name, value in env.items():
        monkeypatch.setenv(name, value)
    get_settings.cache_clear()
    try:
        return CliRunner().invoke(cli, argv)
    finally:
        monkeypatch.undo()
        get_settings.cache_clear()


@pytest.mark.parametrize(
    "argv",
    [["db", "upgrade"], ["accounts", "list"], ["accounts", "create", "someone"],
     ["dlq", "list"], ["status"], ["calibrate", "--profile", "unused.json"]],
)  # fmt: skip
def test_a_database_it_cannot_reach_is_one_line_whatever_the_command(services, monkeypatch, argv):
    """A hurried operator's typo in the database name, or Postgres not started: every
    command that reads the database says so in one line, status 1, with no traceback."""
    missing = f"laneway_none_{uuid.uuid4().hex[:8]}"
    done = invoke_with(monkeypatch, argv, LANEWAY_DATABASE_URL=database_url(missing))
    assert done.exit_code == 1, done.output
    line = done.output.strip()
    assert line.startswith("Error: the database is unreachable:") and missing in line
    assert "\n" not in line and "Traceback" not in line

    refused = database_url(missing).replace(":5432/", f":{free_port()}/")
    done = invoke_with(monkeypatch, argv, LANEWAY_DATABASE_URL=refused)
    assert done.exit_code == 1 and "Connection refused" in done.output, done.output
    assert "\n" not in done.output.strip()


@pytest.mark.parametrize("argv", [["status"], ["health", "gpu0@nowhere"]])
def test_a_redis_it_cannot_reach_is_one_line(migrated, monkeypatch, argv):
    """`health` included: its report comes back through Redis, whose loss Celery's result
    backend raises as a RuntimeError after twenty reconnection attempts."""
    url = f"redis://127.0.0.1:{free_port()}/1"
    done = invoke_with(monkeypatch, argv, LANEWAY_REDIS_URL=url)
    assert done.exit_code == 1, done.output
    assert done.output.startswith("Error: Redis is unreachable:"), done.output
    assert "\n" not in done.output.strip()


@pytest.mark.parametrize(
    ("broker", "says"),
    [("amqp://guest:guest@127.0.0.1:{port}//", "Connection refused"),
     ("amqp://guest:not-the-password@127.0.0.1:5672//", "ACCESS_REFUSED")],
)  # fmt: skip
def test_a_rabbitmq_it_cannot_reach_or_log_in_to_is_one_line(migrated, monkeypatch, broker, says):
    """The batch lanes on RabbitMQ (LANEWAY_BROKER_URL): `status` reads its queues' depths
    there; a refused port or a wrong password is one line naming the broker, without the
    password."""
    url = broker.format(port=free_port())
    done = invoke_with(monkeypatch, ["status"], LANEWAY_BROKER_URL=url)
    assert done.exit_code == 1, done.output
    line = done.output.strip()
    assert line.startswith("Error: the broker is unreachable: RabbitMQ:") and says in line, line
    assert "\n" not in line and "not-the-password" not in line


def test_a_service_error_under_another_library_s_error_is_found() -> None:
    """Celery and kombu raise their own errors from redis-py's and SQLAlchemy's: the
    service is named from the chain of causes; an unrelated error stays unnamed."""
    import redis

    from fleet.cli.common import unreachable_service

    def raised(outer: Exception, inner: Exception | None) -> Exception:
        try:
            try:
                if inner is not None:
                    raise inner
                raise outer
            except Exception as exc:
                if exc is outer:
                    raise
                raise outer from exc
        except Exception as caught:  # noqa: BLE001 - the chain is what is tested
            return caught

    lost = raised(RuntimeError("Retry limit exceeded"), redis.ConnectionError("Error 111"))
    assert unreachable_service(lost) == "Redis is unreachable: Error 111"
    assert unreachable_service(raised(RuntimeError("x"), None)) is None
    assert unreachable_service(raised(RuntimeError("x"), ValueError("y"))) is None
    looped = RuntimeError("a")
    looped.__context__ = ValueError("b")
    looped.__context__.__context__ = looped  # a cycle ends the walk, it does not hang it
    assert unreachable_service(looped) is None


@pytest.mark.slow  # a Python child: what it prints as it exits is the point
def test_health_without_an_answer_ends_in_one_line(migrated, settings):
    import subprocess
    import sys

    done = subprocess.run(
        [sys.executable, "-m", "fleet.cli", "health", "gpu9@nowhere", "--timeout", "1"],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert done.returncode == 1
    assert done.stderr.strip() == "Error: gpu9@nowhere: no health report (TimeoutError)"
