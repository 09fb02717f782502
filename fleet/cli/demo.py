"""`laneway demo FILE`: start the whole fleet on this machine, submit FILE, show progress
and a summary, stop everything."""

from __future__ import annotations

import itertools
import socket
import sys
import time
from pathlib import Path
from typing import Any

import click

from core.config.settings import Settings
from fleet.cli.common import cli_settings
from fleet.cli.jobs import print_summary, wait_with_bar

# How long the demo waits for a cpu worker to load its models before it submits anyway.
WORKER_START_TIMEOUT = 180.0


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@click.command()
@click.argument("file", type=click.Path(exists=True, dir_okay=False, path_type=Path))
@click.option("--show", default=5, show_default=True, help="example results to print")
def demo(file: Path, show: int) -> None:
    """Start the fleet, submit FILE, show progress and a summary, stop everything."""
    from core.store.redis_conn import embedded_redis

    settings = cli_settings()
    port = _free_port()
    with embedded_redis(settings):
        final = _run_demo(settings, file, port, show)
    if final.status != "succeeded":
        sys.exit(1)


def _wait_for_a_cpu_worker(settings: Settings, check: Any) -> None:
    """Until a cpu worker has loaded its models (its row's idle_since moves past its start,
    workers/registry.py): the job's time then measures this machine's throughput, not a
    worker's start. Gives up after WORKER_START_TIMEOUT and submits anyway."""
    from jobs.lanes import alive_workers

    def ready() -> bool:
        return any(
            w.idle_since is not None and w.idle_since > w.started_at
            for w in alive_workers(settings, "cpu")
        )

    deadline = time.monotonic() + WORKER_START_TIMEOUT
    while not ready() and time.monotonic() < deadline:
        check()
        time.sleep(0.5)


def _run_demo(settings: Settings, file: Path, port: int, show: int) -> Any:
    from laneway import Client, LanewayError

    from db.accounts import create_account
    from db.session import session_scope
    from fleet.processes import full_fleet

    log_dir = settings.home / "logs"
    fleet = full_fleet(settings, "127.0.0.1", port, log_dir=log_dir)
    fleet.supervise_in_background()
    click.echo(f"fleet started (web on port {port}); process logs in {log_dir}")
    try:
        with session_scope(settings) as session:
            _, key = create_account(session, f"demo-{int(time.time() * 1000)}", "standard")
        client = Client(f"http://127.0.0.1:{port}", key)

        def check() -> None:
            if fleet.dead():
                raise LanewayError(0, "fleet_died", f"fleet processes died: {fleet.dead()}")

        client.wait_healthy(timeout=60, check=check)
        _wait_for_a_cpu_worker(settings, check)
        job = client.submit_file(file)
        click.echo(f"submitted {file} as job {job.id} ({job.lane} lane)")
        final = wait_with_bar(client, job.id, check=check)
        print_summary(final)
        for record in itertools.islice(client.results(job.id), show):
            click.echo(f"  {record.id}: {record.label} ({record.score})")
    finally:
        fleet.stop()
    return final
