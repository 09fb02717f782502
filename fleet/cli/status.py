"""`laneway status`: the fleet as an operator sees it, read from the database (workers
beating, jobs not yet ended) and the broker (each queue's depth), as `laneway dlq` reads
them: it needs the fleet's settings, not an API key."""

from __future__ import annotations

import json
from typing import Any

import click

from fleet.cli.common import cli_settings, json_option, table


def fleet_status(settings: Any) -> dict[str, Any]:
    """Queues (waiting, delivered), live workers and the jobs not yet ended, by status."""
    from sqlalchemy import func, select

    from core.queueing.broker import queue_depths
    from core.store.redis_conn import embedded_redis
    from db.common import alive_workers
    from db.models import FINAL_JOB_STATUSES, Job
    from db.session import session_scope

    with embedded_redis(settings):
        queues = queue_depths(settings)
    with session_scope(settings) as session:
        workers = [
            {"name": w.hostname, "queues": ",".join(w.queues), "device": w.device,
             "running": w.running_tasks, "pid": w.pid}
            for w in alive_workers(session, settings.worker_dead_after)
        ]  # fmt: skip
        open_jobs = session.execute(
            select(Job.status, Job.lane, func.count(), func.sum(Job.total_items))
            .where(Job.status.not_in(FINAL_JOB_STATUSES))
            .group_by(Job.status, Job.lane)
        ).all()
    jobs = [
        {"status": status, "lane": lane, "jobs": n, "items": int(items or 0)}
        for status, lane, n, items in sorted(open_jobs)
    ]
    lanes = [{"queue": name, **depth} for name, depth in queues.items()]
    return {"queues": lanes, "workers": workers, "jobs": jobs}


@click.command()
@json_option
def status(as_json: bool) -> None:
    """The fleet now: each queue's depth, the workers alive, and the jobs not yet ended."""
    state = fleet_status(cli_settings())  # a service away: one line (LazyGroup.invoke)
    if as_json:
        click.echo(json.dumps(state))
        return
    click.echo("queues")
    table(state["queues"], (("queue", 16), ("queued", 8), ("delivered", 9), ("depth", 0)), False)
    click.echo(f"\nworkers ({len(state['workers'])} alive)")
    columns = (("name", 36), ("queues", 20), ("device", 6), ("running", 7), ("pid", 0))
    table(state["workers"], columns, False)
    click.echo("\njobs not ended")
    table(state["jobs"], (("status", 10), ("lane", 4), ("jobs", 6), ("items", 0)), False)
