"""The API's commands: `laneway submit`, `laneway jobs list|show|results|cancel`. They call
the web app with an API key (--url/--api-key or LANEWAY_URL/LANEWAY_API_KEY), as any
client does; a refused connection, a bad key or a missing job is one line and status 1."""

from __future__ import annotations

import json
import shutil
import sys
import tempfile
from pathlib import Path
from typing import Any

import click

from db.models import JOB_STATUSES
from fleet.cli.common import api, api_options, json_option, table
from jobs.inputs import GZIP_MAGIC


@click.command()
@click.argument("file", type=click.Path(exists=True, dir_okay=False, allow_dash=True))
@click.option("--labels", default=None, help="comma-separated labels (default: settings)")
@click.option("--tasks", default="classify", show_default=True, help="comma-separated tasks")
@click.option(
    "--format", "fmt", type=click.Choice(("csv", "jsonl")), default=None,
    help="the input's format (default: from the file's name; for -, from its first line)",
)  # fmt: skip
@click.option("--wait/--no-wait", default=False, help="show progress until the job ends")
@api_options
def submit(
    file: str, labels: str | None, tasks: str, fmt: str | None, wait: bool,
    url: str | None, api_key: str | None,
) -> None:  # fmt: skip
    """Submit a CSV (id,text) or JSONL file, optionally gzipped (.csv.gz, .jsonl.gz), or -
    for standard input, as a job; the upload shows a progress bar, and --wait one for the
    job."""
    with api(url, api_key) as client, tempfile.TemporaryDirectory() as scratch:
        path = _stdin_file(Path(scratch), fmt) if file == "-" else _named(Path(file), fmt, scratch)
        job = upload(client, path, tasks=tasks, labels=labels)
        click.echo(f"job {job.id} queued on the {job.lane} lane")
        if wait:
            final = wait_with_bar(client, job.id)
            print_summary(final)
            if final.status not in ("succeeded", "partial"):
                sys.exit(1)


SNIFF = 4096  # bytes of the (plain) input that tell its format


def _stdin_file(scratch: Path, fmt: str | None) -> Path:
    """Standard input, spooled to a file the upload streams from (its size is sent first;
    copied in pieces, so a large pipe never sits in memory), named for its format and,
    when it is gzip (`cat items.csv.gz | laneway submit -`), .gz: the server reads the
    compression and the format from the name."""
    spool = scratch / "stdin"
    with click.open_file("-", "rb") as stdin, open(spool, "wb") as out:
        first = stdin.read(65536)
        out.write(first)
        shutil.copyfileobj(stdin, out)
    gzipped = first[:2] == GZIP_MAGIC
    head = _gunzipped_head(first) if gzipped else first
    if not head.strip() and spool.stat().st_size <= len(first):
        raise click.ClickException("standard input is empty: pipe a CSV (id,text) or JSONL file")
    fmt = fmt or ("jsonl" if head.lstrip()[:1] == b"{" else "csv")
    return spool.rename(scratch / f"stdin.{fmt}{'.gz' if gzipped else ''}")


def _gunzipped_head(first: bytes) -> bytes:
    """The first bytes of gzip data as plain text (SNIFF at most, whatever they inflate
    to), to tell its format; b"-" where the data is not valid gzip (the server's answer
    then says what is wrong with it)."""
    import zlib

    try:
        return zlib.decompressobj(wbits=31).decompress(first, SNIFF)
    except zlib.error:
        return b"-"


def _named(path: Path, fmt: str | None, scratch: str) -> Path:
    """The file under a name that says its format (--format's suffix) and, for gzip content,
    .gz, where its own name does not (a link, not a copy). Only a regular file: a device
    or a pipe has no size to send and no start to go back to for a retry."""
    if not path.is_file():
        raise click.ClickException(
            f"{path} is not a regular file (a device, a pipe or a socket): "
            "pipe its content to `laneway submit -` instead"
        )
    with open(path, "rb") as fh:
        gzipped = fh.read(2) == GZIP_MAGIC
    plain = path.name.removesuffix(".gz")
    if fmt is not None and not plain.endswith(f".{fmt}"):
        plain = f"{Path(plain).stem}.{fmt}"
    name = f"{plain}.gz" if gzipped or path.name.endswith(".gz") else plain
    if name == path.name:
        return path
    named = Path(scratch) / name
    named.symlink_to(path.resolve())
    return named


def upload(client: Any, file: Path, **kwargs: Any) -> Any:
    """Client.submit_file with a progress bar on stderr following the upload."""
    stderr = sys.stderr
    size = file.stat().st_size
    with click.progressbar(length=size, label=f"uploading {file.name}", file=stderr) as bar:
        return client.submit_file(
            file, progress=lambda sent, _: bar.update(sent - bar.pos), **kwargs
        )


def wait_with_bar(client: Any, job_id: str, check: Any = None) -> Any:
    """Client.wait with a progress bar of the job's items on stderr."""
    total = client.job(job_id).progress.total
    stderr = sys.stderr
    label = f"job {job_id[:8]}"
    with click.progressbar(
        length=total, label=label, show_eta=True, show_pos=True, file=stderr
    ) as bar:
        return client.wait(
            job_id, progress=lambda job: bar.update(job.progress.done - bar.pos), check=check
        )


def print_summary(job: Any) -> None:
    """A finished job: counts, the throughput of its run, its stages, runtimes and cost."""
    t = job.timings or {}
    counts = job.counts or {}
    click.echo(
        f"job {job.id}: {job.status} on the {job.lane} lane; "
        f"{counts.get('succeeded', 0)} succeeded, {counts.get('failed', 0)} failed"
    )
    if t.get("run_seconds"):
        rate = job.progress.total / t["run_seconds"]
        stages = job.stage_seconds or {}
        click.echo(
            f"ran {t['run_seconds']:.1f} s after {t['queued_seconds']:.1f} s queued "
            f"({rate:.0f} items/s; stages: pre {stages.get('pre', 0):.2f} s, "
            f"model {stages.get('model', 0):.1f} s, post {stages.get('post', 0):.2f} s)"
        )
    runtimes = job.get("runtimes") or []
    if runtimes:
        ran = "; ".join(f"{r['runtime']} ({r['chunks']} chunks)" for r in runtimes)
        click.echo(f"ran with {ran}")
    if job.cost:
        click.echo(f"cost ${job.cost['total']:.6f} (${job.cost['per_item']:.8f} per item)")
    for label, n in (job.label_counts or {}).items():
        click.echo(f"  {n:6d}  {label}")


# --- laneway jobs ---------------------------------------------------------------------------


@click.group()
def jobs() -> None:
    """Your jobs, through the API: list, show, results, cancel."""


@jobs.command("list")
@click.option("--status", "statuses", multiple=True, type=click.Choice(JOB_STATUSES),
              help="only jobs in this status (repeatable)")  # fmt: skip
@click.option("--limit", type=click.IntRange(1, 100), default=20, show_default=True)
@click.option("--cursor", default=None, help="the next page: the cursor the last one printed")
@json_option
@api_options
def jobs_list(
    statuses: tuple[str, ...], limit: int, cursor: str | None, as_json: bool,
    url: str | None, api_key: str | None,
) -> None:  # fmt: skip
    """Your jobs, newest first, a page at a time."""
    with api(url, api_key) as client:
        page = client.jobs(status=list(statuses) or None, limit=limit, cursor=cursor)
    rows = [
        {"id": j.id, "status": j.status, "lane": j.lane, "items": j.total_items,
         "tasks": ",".join(j.tasks or []), "created": j.created_at}
        for j in page
    ]  # fmt: skip
    columns = (("id", 36), ("status", 10), ("lane", 4), ("items", 8), ("tasks", 22),
               ("created", 0))  # fmt: skip
    table(rows, columns, as_json)
    if page.next_cursor:
        click.echo(f"more: --cursor {page.next_cursor}", err=True)


@jobs.command("show")
@click.argument("job_id")
@json_option
@api_options
def jobs_show(job_id: str, as_json: bool, url: str | None, api_key: str | None) -> None:
    """A job's status, progress, counts, timings and cost."""
    with api(url, api_key) as client:
        job = client.job(job_id)
    if as_json:
        click.echo(json.dumps(job.raw))
        return
    p = job.progress
    click.echo(f"job {job.id}: {job.status} on the {job.lane} lane ({', '.join(job.tasks or [])})")
    click.echo(f"progress {p.done}/{p.total} ({p.percent}%)")
    if job.ended:
        print_summary(job)


@jobs.command("results")
@click.argument("job_id")
@click.option("--format", "fmt", type=click.Choice(("jsonl", "csv")), default="jsonl",
              show_default=True)  # fmt: skip
@api_options
def jobs_results(job_id: str, fmt: str, url: str | None, api_key: str | None) -> None:
    """A job's results on standard output, one item per line, as they stream in."""
    with api(url, api_key) as client:
        if fmt == "csv":
            for text in client.results_csv(job_id):
                click.echo(text, nl=False)
            return
        for record in client.results(job_id):
            click.echo(json.dumps(record.raw))


@jobs.command("cancel")
@click.argument("job_id")
@api_options
def jobs_cancel(job_id: str, url: str | None, api_key: str | None) -> None:
    """Cancel a job: chunks not started are skipped, running ones stop at their next batch."""
    with api(url, api_key) as client:
        job = client.cancel(job_id)
    click.echo(f"job {job.id}: {job.status}")
