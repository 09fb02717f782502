"""`laneway dlq`: dead letters, read and sent back in the database directly."""

from __future__ import annotations

import click

from fleet.cli.common import cli_settings, json_option, table


@click.group()
def dlq() -> None:
    """Dead letters: items and chunks that failed for good."""


@dlq.command("list")
@click.option("--job", "job_id", default=None, help="only this job's letters")
@click.option("--all", "show_all", is_flag=True, help="include letters already sent back")
@json_option
def dlq_list(job_id: str | None, show_all: bool, as_json: bool) -> None:
    """List dead letters (open ones unless --all)."""
    from sqlalchemy import select

    from db.models import DeadLetter
    from db.session import session_scope

    query = select(DeadLetter).order_by(DeadLetter.id)
    if job_id:
        query = query.where(DeadLetter.job_id == _job_uuid(job_id))
    if not show_all:
        query = query.where(DeadLetter.retried_at.is_(None))
    with session_scope(cli_settings()) as session:
        letters = session.scalars(query).all()
        for x in letters:
            state = "sent back" if x.retried_at else "open"
            if as_json:
                row = {"id": x.id, "job": str(x.job_id), "kind": x.kind, "state": state,
                       "attempts": x.attempts, "items": x.item_ids, "error": x.error}  # fmt: skip
                table([row], (), as_json=True)
                continue
            items = ",".join(x.item_ids[:5]) + (" ..." if len(x.item_ids) > 5 else "")
            click.echo(
                f"{x.id}\t{x.job_id}\t{x.kind}\t{state}\tattempts={x.attempts}\t"
                f"items={items}\t{x.error}"
            )
    click.echo(f"{len(letters)} dead letter(s)", err=True)


def _job_uuid(job_id: str):  # noqa: ANN202
    import uuid

    try:
        return uuid.UUID(job_id)
    except ValueError:
        raise click.BadParameter(f"not a job id: {job_id!r}") from None


@dlq.command("retry")
@click.option("--job", "job_id", default=None, help="send back this job's open letters")
@click.option("--id", "letter_ids", type=int, multiple=True, help="a letter id (repeatable)")
@click.option("--all", "every", is_flag=True, help="send back every open letter")
def dlq_retry(job_id: str | None, letter_ids: tuple[int, ...], every: bool) -> None:
    """Send dead letters back: their items run again and their jobs are finalized anew."""
    from jobs.lifecycle import retry_dead_letters

    if not (job_id or letter_ids or every):
        raise click.UsageError("name --job JOB, --id N or --all")
    retried = retry_dead_letters(
        job_id=_job_uuid(job_id) if job_id else None,
        letter_ids=list(letter_ids) or None,
        settings=cli_settings(),
    )
    for job, items in retried.jobs.items():
        click.echo(f"job {job}: {items} item(s) sent back")
    for job, why in retried.skipped.items():
        click.echo(f"job {job}: not sent back ({why})", err=True)
    click.echo(f"{retried.letters} dead letter(s) sent back", err=True)
