"""`laneway inbox`: the nightly inbox (LANEWAY_INBOX_DIR/<account>/)."""

from __future__ import annotations

import click

from fleet.cli.common import cli_settings


@click.group()
def inbox() -> None:
    """The nightly inbox (LANEWAY_INBOX_DIR/<account>/)."""


@inbox.command("scan")
@click.option("--json", "as_json", is_flag=True, help="one JSON object per file")
def inbox_scan(as_json: bool) -> None:
    """Take the inbox's complete files now, as beat does on LANEWAY_INBOX_SCHEDULE."""
    import json

    from core.obs.logsafe import printable
    from core.store.redis_conn import embedded_redis
    from jobs.inbox import scan_inbox

    settings = cli_settings()
    with embedded_redis(settings):
        outcomes = scan_inbox(settings, progress=lambda message: click.echo(message, err=True))
    for outcome in outcomes:
        if as_json:
            click.echo(json.dumps(outcome.as_dict()))
            continue
        shown = outcome.as_dict()  # names escaped: a newline in one never forges a line
        where = f"{shown['account']}/{shown['name']}" if outcome.account else shown["name"]
        job = f" job {outcome.job_id}" if outcome.job_id else ""
        click.echo(f"{outcome.status:9s} {where}{job}: {printable(outcome.detail)}")
    if not outcomes:
        click.echo(f"nothing in {settings.inbox_dir}", err=True)
